"""Strategies: functions that decide which parameters train, and how (``conf/freeze``).

A strategy takes the built model and the ``freeze`` config, sets ``requires_grad`` (wrapping the
model when it adds parameters, as LoRA does) and returns an ``Applied``: the model to train and the
resulting counts, plus what the training loop needs without knowing the strategy: optimiser
parameter groups, Trainer callbacks and artifact writers. One file per family, registered here
with the ``freeze`` keys it reads (``register``; docs/extending.md). The head always trains.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn

from ablate.config import FreezeConfig
from ablate.errors import AblateError
from ablate.strategies.base import Applied


@dataclass(frozen=True)
class Strategy:
    """A strategy family: its function and the ``freeze`` keys it reads (any other key set away
    from its default is an error)."""

    name: str
    apply: Callable[[nn.Module, DictConfig], Applied]
    keys: tuple[str, ...] = ()


STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    """Add ``strategy`` to the registry (``freeze.strategy`` picks it by name); returns it."""
    unknown = [
        k for k in strategy.keys if k not in {f.name for f in dataclasses.fields(FreezeConfig)}
    ]
    if unknown:
        raise AblateError(f"strategy {strategy.name!r}: {unknown} are not freeze keys")
    STRATEGIES[strategy.name] = strategy
    return strategy


def check_keys(cfg: DictConfig) -> None:
    """Refuse a ``freeze`` key set away from its default that the chosen strategy ignores."""
    used = STRATEGIES[cfg.strategy].keys
    defaults = FreezeConfig()
    for f in dataclasses.fields(FreezeConfig):
        if f.name in ("name", "strategy", *used) or f.name not in cfg:
            continue
        value = cfg[f.name]
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value)
        if value != getattr(defaults, f.name):
            raise AblateError(
                f"freeze.{f.name}={value} has no effect with freeze.strategy={cfg.strategy} "
                f"(its keys: {', '.join(used) or 'none'})"
            )


def apply(model: nn.Module, cfg: DictConfig) -> Applied:
    """Run the strategy named by ``freeze.strategy`` on ``model``; train ``Applied.model``."""
    if cfg.strategy not in STRATEGIES:
        raise AblateError(
            f"freeze.strategy={cfg.strategy!r} is not one of {', '.join(sorted(STRATEGIES))}"
        )
    check_keys(cfg)
    applied = STRATEGIES[cfg.strategy].apply(model, cfg)
    if applied.model is None:
        applied.model = model
    return applied


def _register_builtin() -> None:
    from ablate.strategies import bitfit, gradual, layers, llrd, peft_methods

    register(Strategy("layers", layers.freeze_layers, layers.SELECTORS))
    register(Strategy("bitfit", bitfit.freeze_bitfit))
    register(Strategy("llrd", llrd.freeze_llrd, (*layers.SELECTORS, "decay")))
    register(Strategy("gradual", gradual.freeze_gradual, ("schedule",)))
    for method in peft_methods.METHODS.values():  # lora, dora, adalora, ...: one each
        apply_method = functools.partial(peft_methods.apply_method, method=method)
        register(Strategy(method.name, apply_method, method.keys))


_register_builtin()
