"""What a run logs as MLflow params: what a researcher set or compares, not the whole config.

The whole resolved config goes to the run's ``config.yaml`` artifact (and ``.hydra/``); the data
files' URLs and sha256 to its datasets and ``run.json``. The params keep each group's keys that
say what was computed, the chosen strategy's own ``freeze`` keys (not the other strategies'),
and a speed switch only where it is set away from its default or named on the command line.
A key left out is at its schema default: ``defaults()`` gives those values, so runs logged with
every key and runs logged with these compare alike.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, OmegaConf

from ablate import config
from ablate.switches import SWITCHES

# Pins of the data files (URL, sha256): the run's datasets and run.json hold them.
PINS = "data.splits."
# A run's tag: the keys outside ``freeze.*`` that its freeze option changes (``option_keys``)
OPTION_KEYS_TAG = "ablate.option_keys"
# A run's tag: its MLflow run was reopened by a resume (its span counts the time it lay stopped)
RESUMED_TAG = "ablate.resumed"
# A run's tag: the model name of the CPU it ran on (its times compare only with that machine's)
CPU_TAG = "cpu"


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> {"a.b.c": leaf}; lists stay leaves (MLflow params are flat strings)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


@functools.cache
def option_keys(freeze: str) -> frozenset[str]:
    """Keys outside ``freeze.*`` that choosing the freeze option changes (a ``# @package
    _global_`` option such as ``features`` brings its head, and what its defaults bring): the
    option composed beside ``freeze=none``; none for an option ``conf/freeze`` lacks. A run
    records them when it runs (``OPTION_KEYS_TAG``), so a report reads them from the run."""
    option = config.conf_dir() / "freeze" / f"{freeze}.yaml"
    if not option.is_file() or _own_package_only(option):
        return frozenset()

    def composed(option: str) -> dict[str, Any]:
        tree = OmegaConf.to_container(config.composed(f"freeze={option}"), resolve=False)
        tree.pop("freeze")
        return flatten(tree)

    mine, base = composed(freeze), composed("none")
    return frozenset(k for k in mine.keys() | base.keys() if mine.get(k) != base.get(k))


def _own_package_only(option: Path) -> bool:
    """Whether a ``conf/freeze`` option sets ``freeze.*`` alone: no package header and no
    defaults list, so composed beside ``freeze=none`` no other key differs (and no composition,
    a third of a second each, is needed to say so)."""
    from hydra.plugins.config_source import ConfigSource

    text = option.read_text()
    if ConfigSource._get_header_dict(text)["package"] is not None:  # Hydra's own header parser
        return False
    loaded = yaml.safe_load(text)
    return not (isinstance(loaded, dict) and "defaults" in loaded)


def selected(
    cfg: config.TrainCore, strategy_keys: Iterable[str], named: Iterable[str] = ()
) -> dict[str, Any]:
    """The params of a run of ``cfg``: ``strategy_keys`` are the ``freeze`` keys its strategy
    reads, ``named`` the keys given on the command line (a switch named there is kept even at
    its default, and even when it changes no number)."""
    flat = flatten(OmegaConf.to_container(cfg, resolve=True))
    identity = config.flags("identity")
    switches = {s.key: s.default for s in SWITCHES}
    own = {"freeze.name", "freeze.strategy", *(f"freeze.{k}" for k in strategy_keys)}
    named = set(named)
    kept = {}
    for key, value in flat.items():
        if key in switches:
            if value != switches[key] or key in named:
                kept[key] = value
        elif key.startswith(PINS) or not identity.get(key, True):
            continue
        elif not key.startswith("freeze.") or key in own:
            kept[key] = value
    return kept


@functools.cache
def defaults() -> dict[str, str]:
    """Every schema key that has a default, as MLflow logs it (a string), by dotted key."""
    out = {}
    for name, f in config.schema_keys():
        if (value := config.key_default(f)) == MISSING:
            continue
        if isinstance(value, str) and "${" in value:  # resolved per machine (a path, a URI)
            continue
        out[name] = str(value)
    return out


def shared(runs: list) -> dict[str, str]:
    """The params every one of ``runs`` (MLflow runs) logged with one value: a sweep's common
    settings."""
    common = dict(runs[0].data.params) if runs else {}
    for r in runs[1:]:
        common = {k: v for k, v in common.items() if r.data.params.get(k) == v}
    return common


def settings(params: dict[str, str]) -> dict[str, str]:
    """A run's params without those that may differ between seeds of one study (the seed, and
    keys the schema marks as no setting: where files sit, threads, switches that change nothing
    beyond seed noise): runs of one strategy with equal settings are its seeds. The strategy's
    own ``freeze.*`` keys stay: a variant of a strategy is not one of its seeds."""
    setting = config.flags("setting")
    # a key a run did not log is at its default; the data files' pins are the datasets' digests
    params = {k: v for k, v in {**defaults(), **params}.items() if not k.startswith(PINS)}

    def is_setting(key: str) -> bool:  # a key inside a dict-valued key (tracking.tags.x) is its
        while key not in setting and "." in key:
            key = key.rsplit(".", 1)[0]
        return setting.get(key, True)

    return {k: v for k, v in params.items() if k not in ("seed", "freeze") and is_setting(k)}


def primary_metric(metrics: dict[str, float], default: str = "accuracy") -> str:
    """A run's primary metric: the one it logged ``best_dev_<metric>`` for."""
    best = sorted(k.removeprefix("best_dev_") for k in metrics if k.startswith("best_dev_"))
    return best[0] if len(best) == 1 else default
