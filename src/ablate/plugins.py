"""The training-plugin interface: what a plugin sees of a run (``Context``), its hooks
(``Plugin``), and the plugins a run uses, in order (``register``, ``active``).

A plugin implements the switches it names (``ablate.switches``). Training calls its hooks in
registration order: ``check(ctx)`` refuses a setting that cannot work here before any run
opens; then, in the run,

1. ``arguments(ctx)``: TrainingArguments fields (an optimiser, bf16, a sampling strategy);
2. ``prepare(ctx)``: before the Trainer exists; may wrap ``ctx.model`` or ``ctx.collator``, add
   columns to ``ctx.features``, add Trainer callbacks (``ctx.callbacks``) or Trainer mixins
   (``ctx.mixins``: classes whose methods override the Trainer's, calling ``super()``);
3. ``attach(ctx, trainer)``: once the Trainer is built (its device is known).

``prepare`` and ``attach`` return what they applied per switch: ``{"<switch name>": "off" |
"not applied: <why>" | <what it did>}``, recorded on the run as ``speed.<switch name>``.

A plugin that reads what another adds names it: ``provides`` lists what a plugin adds (an
attribute of the wrapped model, of the collator), ``uses`` what it reads when present; ``active``
refuses an order in which a plugin reads what a later one adds. Training itself provides
``CORE_PROVIDES``. The built-in plugins are ``ablate.speed``'s and the lr study's trial
(``ablate.lrstudy``), registered when they load (``ablate.extensions``); without them a run
trains with the core Trainer alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from ablate.switches import BY_KEY

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase, TrainerCallback, TrainingArguments

    from ablate.strategies.base import Applied
    from ablate.tasks import Task
    from ablate.tracking.recorder import Recorder

# What training adds before any plugin's hooks run: the training collator's token counts
# (``ablate.training.meter.BatchStats``), which a plugin that computes other rows than the
# collator collated takes over.
CORE_PROVIDES = ("collator.stats",)


@dataclass
class Context:
    """What a plugin sees of one run. ``features``: split -> list of feature dicts; ``record``:
    the run's recorder (None in ``check``); ``device``: ``cpu`` or ``cuda``; ``args``: the
    TrainingArguments, once the ``arguments`` hooks have run."""

    cfg: DictConfig
    task: Task
    applied: Applied
    model: nn.Module
    features: dict[str, list[dict]]
    tokenizer: PreTrainedTokenizerBase | None
    record: Recorder | None
    device: str
    collator: Callable[[list[dict]], dict]
    callbacks: list[TrainerCallback] = field(default_factory=list)
    mixins: list[type] = field(default_factory=list)
    args: TrainingArguments | None = None
    status: dict[str, str] = field(default_factory=dict)

    def value(self, key: str) -> Any:
        """The value in effect of switch ``key`` (e.g. ``trainer.bf16``) on this run's device:
        the config's, or the switch's default for the device when the config says null."""
        return BY_KEY[key].resolve(OmegaConf.select(self.cfg, key), self.device)


class Plugin:
    """One feature behind the switches in ``switches``; every hook is optional."""

    name: str = ""
    switches: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()  # what it adds that another plugin may read
    uses: tuple[str, ...] = ()  # what it reads when another plugin (or training) added it

    def check(self, ctx: Context) -> None:
        """Refuse a setting that cannot work here (an AblateError), before any run is opened."""

    def arguments(self, ctx: Context) -> dict[str, Any]:
        """TrainingArguments fields this plugin sets."""
        return {}

    def prepare(self, ctx: Context) -> dict[str, str]:
        """Wrap or extend what the Trainer will be built from; what was applied, per switch."""
        return {}

    def attach(self, ctx: Context, trainer) -> dict[str, str]:
        """Act on the built Trainer; what was applied, per switch."""
        return {}


def off_or(ctx: Context, key: str, why_not: str | None) -> str | None:
    """``"off"`` when switch ``key`` is off, ``"not applied: <why_not>"`` when it is on but cannot
    apply, else None (it applies)."""
    if not ctx.value(key):
        return "off"
    return None if why_not is None else f"not applied: {why_not}"


# Registered plugins, in hook order: a class, or "module:name" of a class or a list of classes,
# imported when a run first asks (a plugin module imports torch; the schema must not wait on it).
_REGISTERED: list[type[Plugin] | str] = []


def register(plugin: type[Plugin] | str) -> type[Plugin] | str:
    """Add a plugin class (or ``"module:name"`` of one or of a list of them) after those
    registered before; every run instantiates it. Returns it."""
    if plugin not in _REGISTERED:
        _REGISTERED.append(plugin)
    return plugin


def _classes() -> list[type[Plugin]]:
    found: list[type[Plugin]] = []
    for entry in _REGISTERED:
        if isinstance(entry, str):
            module, name = entry.split(":")
            loaded = getattr(importlib.import_module(module), name)
            found += loaded if isinstance(loaded, (list, tuple)) else [loaded]
        else:
            found.append(entry)
    return found


def check_order(plugins: list[Plugin]) -> None:
    """Refuse plugins in an order where one reads what a later one adds, or two add the same."""
    added: dict[str, str] = dict.fromkeys(CORE_PROVIDES, "training")
    later = {name: p.name for p in plugins for name in p.provides}
    for plugin in plugins:
        for name in plugin.uses:
            if name not in added and name in later:
                raise ValueError(
                    f"plugin {plugin.name!r} reads {name!r}, which plugin {later[name]!r} adds "
                    "after it: register that one first"
                )
        for name in plugin.provides:
            if name in added:
                raise ValueError(f"plugins {added[name]!r} and {plugin.name!r} both add {name!r}")
            added[name] = plugin.name


def active() -> list[Plugin]:
    """The plugins of one run: a fresh instance of each registered one, in hook order."""
    plugins = [cls() for cls in _classes()]
    check_order(plugins)
    return plugins
