"""Strategies: functions that decide which parameters train, and how (``conf/freeze``).

A strategy takes the built model and the ``freeze`` config, sets ``requires_grad`` (wrapping the
model when it adds parameters, as LoRA does) and returns an ``Applied``: the model to train and the
resulting counts, plus what the training loop needs without knowing the strategy: optimiser
parameter groups, Trainer callbacks and artifact writers. One file per family, registered here
with the ``freeze`` keys it reads (``register``, which declares them: ``ablate.freeze_keys``) and
its options' place in the report; docs/extending.md. The head always trains.

Importing this package loads no torch: the config schema reads the keys declared here (``--help``
too), and a strategy's function is imported when a run applies it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig, ListConfig, OmegaConf

from ablate import freeze_keys
from ablate.errors import AblateError
from ablate.freeze_keys import Key

if TYPE_CHECKING:
    from torch import nn

    from ablate.config import FreezeConfig
    from ablate.strategies.base import Applied


@dataclass(frozen=True)
class Strategy:
    """A strategy family: its function (or ``"module:function"``, imported when a run applies it),
    the ``freeze`` keys it reads (a ``Key`` declares one, a name reuses one another strategy
    declared; any other key set away from its default is an error), and its freeze options in the
    report's order (none given: the option named like the strategy)."""

    name: str
    apply: Callable[[nn.Module, FreezeConfig], Applied] | str
    keys: tuple[Key | str, ...] = ()
    freeze_options: tuple[str, ...] = ()


STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    """Add ``strategy`` to the registry (``freeze.strategy`` picks it by name) and declare its
    keys; returns it, its keys by name."""
    try:
        names = freeze_keys.declare(strategy.name, strategy.keys)
    except ValueError as exc:
        raise AblateError(str(exc)) from None
    strategy = dataclasses.replace(
        strategy, keys=names, freeze_options=strategy.freeze_options or (strategy.name,)
    )
    STRATEGIES[strategy.name] = strategy
    return strategy


def report_order() -> tuple[str, ...]:
    """The freeze options in the report's order: each strategy's, in the order they registered."""
    return tuple(option for s in STRATEGIES.values() for option in s.freeze_options)


def check_keys(freeze: FreezeConfig) -> None:
    """Refuse a ``freeze`` key set away from its default that the chosen strategy ignores, and a
    value of one of its own keys outside what the key allows."""
    used = STRATEGIES[freeze.strategy].keys
    for name, k in freeze_keys.KEYS.items():
        if name not in freeze:
            continue
        value = freeze[name]
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value)
        if name not in used and value != k.default:
            raise AblateError(
                f"freeze.{name}={value} has no effect with freeze.strategy={freeze.strategy} "
                f"(its keys: {', '.join(used) or 'none'})"
            )
        if name in used and k.allowed and not k.allowed[0](value):
            raise AblateError(
                f"freeze.{name}={value}: must be {k.allowed[1]} (freeze.strategy={freeze.strategy})"
            )


def apply(model: nn.Module, freeze: FreezeConfig) -> Applied:
    """Run the strategy named by ``freeze.strategy`` on ``model``; train ``Applied.model``."""
    if freeze.strategy not in STRATEGIES:
        raise AblateError(
            f"freeze.strategy={freeze.strategy!r} is not one of {', '.join(sorted(STRATEGIES))}"
        )
    check_keys(freeze)
    function = STRATEGIES[freeze.strategy].apply
    if isinstance(function, str):
        module, _, name = function.partition(":")
        function = getattr(importlib.import_module(module), name)
    applied = function(model, freeze)
    if applied.model is None:
        applied.model = model
    return applied


# The block selectors: ``layers`` freezes their union; ``llrd`` freezes it, then decays the rest.
# fmt: off
SELECTORS = (
    Key("all",        bool,      False, "freeze every transformer block"),
    Key("first",      int,       0,     "freeze blocks 0..first-1"),
    Key("last",       int,       0,     "freeze the last `last` blocks"),
    Key("every",      int,       0,     "freeze blocks 0, every, 2*every, ... (2: alternating)"),
    Key("layers",     list[int], [],    "freeze these block indices"),
    Key("embeddings", bool,      False, "also freeze the embedding layer"),
)
# fmt: on


def _register_builtin() -> None:
    from ablate.strategies import peft_methods

    here = "ablate.strategies"
    # full fine-tuning first, then from least to most frozen (the report's order)
    options = ("none", "embeddings", "first2", "first4", "alt", "last2", "all", "features")
    register(Strategy("layers", f"{here}.layers:freeze_layers", SELECTORS, (*options, "head_only")))
    register(Strategy("bitfit", f"{here}.bitfit:freeze_bitfit"))
    for method in list(peft_methods.METHODS.values()):  # ln_tuning, ia3, vera, lora, ...
        peft_methods.register(method)
    in_0_1 = (lambda v: 0 < v <= 1, "in (0, 1] (1 = no decay)")
    decay = Key("decay", float, 0.9, "lr x decay^(depth from the top) per block", in_0_1)
    register(Strategy("llrd", f"{here}.llrd:freeze_llrd", (*(k.name for k in SELECTORS), decay)))
    top = "top blocks trainable in epoch 1, 2, ...; null = 0, 1, 2, ..."
    schedule = Key("schedule", list[int] | None, None, top)
    register(Strategy("gradual", f"{here}.gradual:freeze_gradual", (schedule,)))


_register_builtin()
