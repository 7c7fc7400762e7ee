"""The speed-plugin interface: what a plugin sees, what it may change, and how it reports.

A plugin implements the switches it names (``ablate.speed.registry``) in hooks called in the
order of ``ablate.speed.plugins.PLUGINS``: ``check(ctx)`` refuses a setting that cannot work here
before any run opens; then, in the run,

1. ``arguments(ctx)``: TrainingArguments fields (an optimiser, bf16, a sampling strategy);
2. ``prepare(ctx)``: before the Trainer exists; may wrap ``ctx.model`` or ``ctx.collator``, add
   columns to ``ctx.features``, add Trainer callbacks (``ctx.callbacks``) or Trainer mixins
   (``ctx.mixins``: classes whose methods override the Trainer's, calling ``super()``);
3. ``attach(ctx, trainer)``: once the Trainer is built (its device is known).

``prepare`` and ``attach`` return what they applied per switch: ``{"<switch name>": "off" |
"not applied: <why>" | <what it did>}``, recorded on the run as ``speed.<switch name>``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ablate.speed.registry import BY_KEY


@dataclass
class Context:
    """What a plugin sees of one run. ``features``: split -> list of feature dicts; ``record``:
    the run's recorder (``tags``, ``metrics``); ``device``: ``cpu`` or ``cuda``; ``args``: the
    TrainingArguments, once the ``arguments`` hooks have run."""

    cfg: DictConfig
    task: Any
    applied: Any
    model: Any
    features: dict[str, list[dict]]
    tokenizer: Any
    record: Any
    device: str
    collator: Callable
    callbacks: list = field(default_factory=list)
    mixins: list[type] = field(default_factory=list)
    args: Any = None
    status: dict[str, str] = field(default_factory=dict)

    def value(self, key: str) -> Any:
        """The value in effect of switch ``key`` (e.g. ``trainer.bf16``) on this run's device:
        the config's, or the registry's default for the device when the config says null."""
        return BY_KEY[key].resolve(OmegaConf.select(self.cfg, key), self.device)


class Plugin:
    """One speed feature behind the switches in ``switches``; every hook is optional."""

    name: str = ""
    switches: tuple[str, ...] = ()

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
