"""Structured-config schemas for every Hydra group, and the resolvers the YAML files use.

The schemas are registered in Hydra's ConfigStore as ``ablate_schema``; ``conf/train.yaml`` lists it
first in its defaults, so every group option is merged onto a typed node and a misspelt key or a
wrong type fails at composition, before any work starts. Every key carries its one-line doc and
the flags the rest of the code derives from (``key``): whether it is part of a run's identity,
and whether runs that differ in it are different settings. The switches and the freeze keys are
added from their declarations (``ablate.switches``: the core's, then those of ``ablate.speed`` and
extensions; ``ablate.freeze_keys``: the strategies'), loaded first by ``register`` when the schema
is first read, so no list of them is kept anywhere else.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field, make_dataclass
from typing import Any, get_type_hints

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import MISSING, DictConfig, OmegaConf

from ablate import extensions, freeze_keys, switches
from ablate.paths import conf_dir, default_data_root, default_tracking_uri, packaged_model_path
from ablate.paths import project_root as project_root  # where the rest of ablate reads them
from ablate.paths import user_cache as user_cache

# Tags of a run trained at the lr its strategy's study picked (``lr_study``): that trial's id,
# and the recipe's lr it replaced (what the report compares with other strategies' lr).
TUNED_TAG = "lr_study.trial"
RECIPE_LR_TAG = "lr_study.recipe_lr"
# Tag of an lr study's trial (``lr_study=trial``): its study's name.
STUDY_TAG = "study"


def _register_resolvers() -> None:
    resolvers = {
        "ablate.data_root": default_data_root,
        "ablate.tracking_uri": default_tracking_uri,
        "ablate.packaged_model": packaged_model_path,
    }
    for name, fn in resolvers.items():
        OmegaConf.register_new_resolver(name, fn, replace=True)


def key(
    default: Any = MISSING,
    doc: str = "",
    *,
    identity: bool = True,
    setting: bool = True,
    added: bool = False,
    option_input: bool = False,
    allowed: tuple[Callable[[Any], bool], str] | None = None,
) -> Any:
    """A schema field with its doc and flags.

    ``identity=False``: where a run goes or how it is scheduled, not what it computes (left out
    of the identity, never a setting). ``setting=False``: runs differing in it still compare as
    seeds of one setting (a path, a thread count). ``added``: added after identities were first
    recorded; hashed only when set away from its default. ``option_input``: no code reads it, only
    the options whose files interpolate it (``${.treebank}``); with any other option, setting it
    is an error (``ablate.pinned``). ``allowed``: a test of a value its type holds, and the
    allowed values in words (``ablate.overrides.disallowed``; null passes where the key takes it).
    """
    setting = setting and identity
    meta = dict(doc=doc, identity=identity, setting=setting, added=added, option_input=option_input)
    meta.update(allowed=allowed)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class SplitFile:
    """One split file of a dataset; ``url``/``sha256`` pin a published release."""

    file: str = key(doc="file name, in the dataset's folder")
    url: str | None = key(None, "where to download it")
    sha256: str | None = key(None, "its pinned sha256; null = any file")


@dataclass
class DataCore:
    """A dataset: where its files are and how to read them (``conf/data``)."""

    name: str = key(doc="short name used in run names and the `data` param")
    task: str = key("pos", "`pos`, `ner`, `sst2` (ablate.tasks)")
    root: str = key(
        "${ablate.data_root:}",
        "folder laid out like `ud/UD_<Name>/`; `$ABLATE_DATA_DIR`, else "
        "the user cache (`conf/local/` may set it)",
        identity=False,
    )
    dir: str = key(doc="folder of the split files, relative to `data.root`")
    treebank: str | None = key(
        None,
        "UD folder name (required with `data=ud`; the other options fix their own)",
        option_input=True,
    )
    version: str | None = key(None, "release of the pinned files (UD version)")
    splits: dict[str, SplitFile] = key(
        {}, "pinned files per split (file, url, sha256); empty = found by the UD naming pattern"
    )
    # No labelled test file (GLUE): hold out this share of train as test, drawn with split_seed,
    # a data setting and not the run's seed, so every run of a grid scores the same test set.
    test_from_train: float | None = key(None, "hold out this share of train as the test set")
    split_seed: int = key(42, "seed of that held-out test set (the same for every run of a grid)")
    extra_test: list[str] = key([], "more CoNLL-U test files, scored as `test_accuracy/<folder>`")
    lowercase: bool = key(True, "lowercase word forms (as the earlier studies)")
    max_train_sentences: int | None = key(None, "use only the first N training sentences")
    max_length: int = key(128, "sub-words per window: longer sentences are split into windows")


@dataclass
class ModelConfig:
    """The encoder (``conf/model``)."""

    name: str = key(doc="short name used in run names and the `model` param")
    name_or_path: str = key(
        doc="hub id or local folder (config, tokenizer, weights)", setting=False
    )
    pretrained: bool = key(True, "false: random weights from the (overridden) config")
    config_overrides: dict[str, Any] = key({}, "config fields to change (hidden size, ...)")
    head: str = key("linear", "task head: `linear` (as the studies) or `bilstm`")
    lstm_hidden: int | None = key(None, "BiLSTM units per direction; null = half the width")


@dataclass
class FreezeCore:
    """Which parts of the encoder train, and how (``conf/freeze``).

    ``strategy=layers``: the union of the block selectors freezes. Other strategies read their own
    keys, declared with them (``ablate.freeze_keys``); setting a key that the chosen strategy
    ignores is an error. The head always trains.
    """

    name: str = key(doc="short name used in run names and the `freeze` param")
    strategy: str = key("layers", "the strategy family (ablate.strategies)")


# values a key's type holds that no run can use (``key``'s ``allowed``)
_COUNT, _POSITIVE = (lambda v: v >= 1, "a positive integer"), (lambda v: v > 0, "a positive number")
_SHARE = (lambda v: 0 <= v < 1, "in [0, 1)")


@dataclass
class TrainerCore:
    """Optimisation recipe (``conf/trainer``); defaults are the earlier study's."""

    epochs: int = key(5, "training epochs; dev is evaluated after each", allowed=_COUNT)
    lr: float = key(5e-5, "AdamW learning rate (linear decay)", allowed=_POSITIVE)
    batch_size: int = key(16, "windows per training batch", allowed=_COUNT)
    eval_batch_size: int = key(
        64, "at most this many windows per dev/test batch", setting=False, allowed=_COUNT
    )
    weight_decay: float = key(0.01, "AdamW weight decay")
    warmup_ratio: float = key(0.0, "share of steps with linear warm-up, in [0, 1)", allowed=_SHARE)
    threads: int | None = key(
        None,
        "torch CPU threads; null = the CPUs this process may use, divided among a parallel "
        "launcher's workers (an lr study's trial: among the study's trials on this machine)",
        setting=False,
    )
    omp_wait_policy: str = key(
        "auto",
        "`passive`: idle OpenMP threads sleep at once, so a run sharing its cores slows by "
        "its share of them, not ~4x (docs/operations.md); `inherit`: the environment's "
        "OMP_WAIT_POLICY, else OpenMP's spin-then-sleep (fastest alone); `auto`: passive when "
        "other work keeps half a CPU busy at the start",
        identity=False,
    )
    checkpoints: bool = key(True, "keep the last epoch's checkpoint until the run finishes")
    resume: bool = key(False, "continue the newest KILLED run of the same config", identity=False)
    keep_model: bool = key(
        True,
        "log the final model (the best epoch's, with early stopping) as an MLflow model",
        identity=False,
    )
    early_stopping_patience: int | None = key(
        None,
        "stop after N epochs without a better primary dev metric; best epoch restored",
        allowed=(_COUNT[0], "a positive number of epochs (or null: off)"),
    )


@dataclass
class TrackingConfig:
    """Where runs are recorded (``conf/tracking``); nothing here changes what a run computes."""

    uri: str = key("${ablate.tracking_uri:}", "MLflow store", identity=False)
    experiment: str = key("ablate", "MLflow experiment", identity=False)
    stale_after_min: float = key(
        30.0, "a RUNNING run without a heartbeat this long is marked KILLED", identity=False
    )
    outage_min: float = key(
        10.0,
        "how long the end of a run waits for a tracking server that went away before it fails; "
        "its record stays in the job folder for `python -m ablate.tracking.replay`",
        identity=False,
    )
    tags: dict[str, str] = key({}, "extra tags on every run", identity=False)


# an lr study's keys: none is hashed into a run's identity (the lr a study picks is)
_study_key = functools.partial(key, identity=False)


@dataclass
class LrStudyConfig:
    """Learning-rate studies (``python -m ablate.lrstudy``, one Optuna study per freeze option, its
    trials' settings in ``lr_study=trial``), and the strategies trained at the lr their study
    picked on dev; nothing here is hashed: the lr it picks is (``trainer.lr``)."""

    freeze: list[str] = _study_key(
        [], "freeze options that train at their study's best lr, not `trainer.lr`"
    )
    experiment: str | None = _study_key(
        None, "MLflow experiment of those studies' trials; null = `tracking.experiment`"
    )
    trials: int = _study_key(
        6,
        "trials a study trains out (pruned ones come on top; each widening of its range: half "
        "as many more)",
    )
    range: list[float] = _study_key([1e-5, 1e-3], "[low, high] lr a study searches (log scale)")
    storage: str | None = _study_key(
        None,
        "Optuna storage (a database URL) the studies persist in; null = `lr_study.db` "
        "beside a sqlite tracking store, or a team server's own (`make server`)",
    )
    pruner: str = _study_key(
        "median",
        "`median`: stop a trial whose dev metric is below the median of earlier "
        "trials' at the same epoch; `none`: every trial trains all its epochs",
    )
    prune_from_epoch: int = _study_key(2, "the first epoch after which a trial may be pruned")
    widen: int = _study_key(
        2,
        "times a best lr in the outer tenth of the range (log scale) widens it 10x at that "
        "edge and the study goes on",
    )


def _with_switches(name: str, core: type, group: str) -> type:
    """``core`` plus a field per switch of ``group`` (``ablate.switches``), or for ``freeze``
    per key the strategies declared (``ablate.freeze_keys``)."""
    fields = [
        (k.name, k.type, key(k.default, freeze_keys.doc(k.name), added=k.added))
        for k in (freeze_keys.KEYS.values() if group == "freeze" else ())
    ]
    for s in switches.in_group(group):
        flags = {"identity": s.in_identity, "setting": not s.comparable, "added": s.added}
        fields.append((s.name, s.type, key(s.default, s.doc, **flags)))
    made = make_dataclass(name, fields, bases=(core,))
    made.__module__ = __name__  # pickled by reference (a parallel launcher's workers)
    return made


@dataclass
class TrainCore:
    """The whole run (``conf/train.yaml``); ``register`` adds the switches: ``TrainConfig``."""

    data: DataCore = MISSING
    model: ModelConfig = MISSING
    freeze: FreezeCore = MISSING
    trainer: TrainerCore = field(default_factory=TrainerCore)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    lr_study: LrStudyConfig = field(default_factory=LrStudyConfig)
    seed: int = key(42, "seeds model init, data order and dropout: `seed=1,2,3`")
    skip_finished: bool = key(
        False, "return at once when an identical config has a FINISHED run", identity=False
    )


def _train_config(data: type, freeze: type, trainer: type) -> type:
    """``TrainCore`` over the given data, freeze and trainer groups (fields keep their order)."""
    groups = [("data", data, MISSING), ("freeze", freeze, MISSING), ("trainer", trainer, None)]
    made = make_dataclass(
        "TrainConfig",
        [(n, t, field(default_factory=t) if d is None else field(default=d)) for n, t, d in groups],
        bases=(TrainCore,),
    )
    made.__module__ = __name__
    return made


# The groups' schemas; ``register`` puts in data's, freeze's and trainer's, with their keys.
GROUPS: dict[str, type] = {
    n: t for n, t in get_type_hints(TrainCore).items() if dataclasses.is_dataclass(t)
}
_registered = (-1, -1)  # the switches and freeze keys the registered schema holds


def _declared() -> tuple[int, int]:
    return len(switches.SWITCHES), len(freeze_keys.KEYS)


def schema_keys() -> Iterator[tuple[str, dataclasses.Field]]:
    """Every leaf key of the schema as (dotted name, its field), groups in schema order."""
    register()
    for f in dataclasses.fields(TrainConfig):
        subs = dataclasses.fields(GROUPS[f.name]) if f.name in GROUPS else ()
        yield from ((f"{f.name}.{s.name}", s) for s in subs) if subs else [(f.name, f)]


def key_default(f: dataclasses.Field) -> Any:
    """A schema key's default (its factory's value), or ``MISSING`` where its option sets it."""
    factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
    return f.default if f.default is not dataclasses.MISSING else (factory or (lambda: MISSING))()


@functools.cache
def flags(name: str) -> dict[str, Any]:
    """The ``identity``, ``setting``, ``added`` or ``option_input`` flag of every schema key, by
    dotted key (a key the schema does not know counts in the identity and as a setting, and is
    neither ``added`` nor an ``option_input``)."""
    return {k: f.metadata.get(name, name in ("identity", "setting")) for k, f in schema_keys()}


def register() -> None:
    """Load the strategies, speed and extensions not loaded yet (``ablate.extensions``), then
    register resolvers and the schema with every switch and freeze key declared so far; again
    only where one was declared since (an extension loaded later). Whatever reads the schema
    calls it: importing this module builds nothing."""
    global DataConfig, FreezeConfig, TrainerConfig, TrainConfig, _registered
    extensions.load()  # the strategies' freeze keys and the switches, declared above this module
    if _registered == _declared():
        return
    _registered = _declared()
    _register_resolvers()
    DataConfig = _with_switches("DataConfig", DataCore, "data")
    FreezeConfig = _with_switches("FreezeConfig", FreezeCore, "freeze")
    TrainerConfig = _with_switches("TrainerConfig", TrainerCore, "trainer")
    TrainConfig = _train_config(DataConfig, FreezeConfig, TrainerConfig)
    GROUPS.update(data=DataConfig, freeze=FreezeConfig, trainer=TrainerConfig)
    flags.cache_clear()
    ConfigStore.instance().store(name="ablate_schema", node=TrainConfig)


def __getattr__(name: str) -> Any:
    """The schema's classes (``TrainConfig``, ``FreezeConfig``, ...), built on first use."""
    if name in ("DataConfig", "FreezeConfig", "TrainerConfig", "TrainConfig"):
        register()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def compose(*overrides: str, hydra: bool = False) -> DictConfig:
    """The config ``python -m ablate.train`` composes with ``overrides``; ``hydra``: with the
    ``hydra`` node (its sweeper's params)."""
    register()
    running = GlobalHydra.instance().is_initialized()  # in an app (a sweep ending): its own
    with nullcontext() if running else initialize_config_dir(str(conf_dir()), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=hydra)


def composed(*overrides: str) -> DictConfig:
    """``compose(*overrides)`` once per process, conf/ folder and schema (composing takes a third
    of a second; a sweep's jobs and a report ask again): shared, so read only."""
    register()
    return _composed(str(conf_dir()), _declared(), overrides)


@functools.cache
def _composed(conf: str, declared: tuple[int, int], overrides: tuple[str, ...]) -> DictConfig:
    return compose(*overrides)
