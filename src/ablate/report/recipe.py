"""A group of runs' settings in words: what they change from the defaults (``describe``), so
that a table or a chart read alone says which recipe its runs followed (``model tiny, 2 epochs,
300 training sentences``) and does not pass for the full study."""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import OmegaConf

from ablate import config

DEFAULTS = "the default settings"
# What a panel names already (its dataset, its model) or where the files are, not how runs use
# them: never a difference worth a word.
_NAMED = (
    "data.name",
    "data.task",
    "data.treebank",
    "data.dir",
    "data.version",
    "data.splits",
    "model.name",
    "model.name_or_path",
)
_ABSENT = object()


def _plural(n: str, one: str, many: str) -> str:
    return f"{n} {one if n == '1' else many}"


# The keys a reader looks for first, in this order, in words; any other as key=value.
_WORDS: dict[str, Callable[[str], str]] = {
    "trainer.epochs": lambda v: _plural(v, "epoch", "epochs"),
    "data.max_train_sentences": lambda v: (
        "every training sentence"
        if v == "None"
        else _plural(v, "training sentence", "training sentences")
    ),
    "trainer.lr": lambda v: f"lr {float(v):.2g}",
    "trainer.batch_size": lambda v: f"batch size {v}",
    "trainer.early_stopping_patience": lambda v: (
        "no early stopping" if v == "None" else f"early stopping after {v} epochs without gain"
    ),
    "model.pretrained": lambda v: "pretrained weights" if v == "True" else "random weights",
}


def _options(data: str, model: str, treebank: str | None) -> tuple[str, ...]:
    """The overrides that choose this dataset and model, where ``conf/`` has them."""
    conf = config.conf_dir()
    out = []
    if (conf / "data" / f"{data}.yaml").is_file():
        out.append(f"data={data}")
    elif treebank == data and (conf / "data" / "ud.yaml").is_file():  # data=ud, any treebank
        out += ["data=ud", f"data.treebank={treebank}"]
    if (conf / "model" / f"{model}.yaml").is_file():
        out.append(f"model={model}")
    return tuple(out)


def default(key: str, data: str, model: str, treebank: str | None = None) -> str | None:
    """``key``'s value in the config composed with this dataset and model and nothing else, as
    MLflow logs it; None where the composed config lacks it."""
    node = OmegaConf.select(config.composed(*_options(data, model, treebank)), key, default=_ABSENT)
    if node is _ABSENT:
        return None
    return str(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node)


def describe(settings: dict[str, str], data: str, model: str, name_model: bool = True) -> str:
    """The ``settings`` of runs of ``data`` and ``model`` (params as logged, seed and strategy
    aside: ``summary.compared``) that differ from the config composed with that dataset and
    model, in words; ``name_model``: also the model where it is not the default one.
    ``DEFAULTS`` where nothing differs."""
    treebank = settings.get("data.treebank")
    parts = {}
    if name_model and model != str(config.composed().model.name):  # conf/train.yaml's model
        parts["model.name"] = f"model {model}"
    first = list(_WORDS)
    for key in sorted(settings, key=lambda k: (first.index(k) if k in first else len(first), k)):
        value = settings[key]
        if (
            key.startswith(_NAMED)
            or any(k.startswith(f"{key}.") for k in settings)  # a dict logged entry by entry
            or value == default(key, data, model, treebank)
        ):
            continue
        short = key.split(".", 1)[-1]
        parts[key] = _WORDS[key](value) if key in _WORDS else f"{short}={value}"
    return ", ".join(parts.values()) or DEFAULTS


def named(report, panel: str) -> tuple[str, str]:
    """A panel's name and its settings in words (what differs from the defaults). The name is
    its dataset (and model): the settings tell its groups of settings apart, unless two read
    alike, where it keeps the group's key=value label."""
    settings = dict(zip(report.summary.panel, report.summary.settings.fillna(""), strict=True))
    groups = report.runs.drop_duplicates("panel").set_index("panel").group.fillna("")

    def short(p: str) -> str:
        return p.removesuffix(f" · {groups[p]}") if groups.get(p) else p

    alike = [p for p in settings if (short(p), settings[p]) == (short(panel), settings[panel])]
    return (short(panel) if len(alike) == 1 else panel), settings[panel]


def heading(report, panel: str) -> str:
    """A panel's heading: ``<dataset> — <its settings beyond the defaults>``."""
    name, settings = named(report, panel)
    return f"{name} — {settings}" if settings else name
