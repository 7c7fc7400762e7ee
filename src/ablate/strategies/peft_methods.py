"""Parameter-efficient methods built through peft (``METHODS``), one strategy each
(``freeze.strategy`` names the method).

Every method freezes the encoder, adds (or, LN tuning, copies) the modules it trains on the
encoder's ``target_modules`` and trains them with the whole head. The run's artifact
``adapter/`` holds what trained and nothing else (peft's ``save_pretrained``).

This module declares the methods and their ``freeze`` keys (pure data, no torch: the config schema
reads them); ``peft_build`` builds a method on a model. Adding one is a ``Method`` in ``METHODS``,
its option file and its test (docs/extending.md).

Prefix tuning (P-tuning v2) and prompt tuning are not here: see docs/tasks-and-strategies.md.
"""

from __future__ import annotations

import re
from typing import Any

from ablate import config
from ablate.errors import AblateError
from ablate.freeze_keys import Key
from ablate.strategies.peft_spec import Method

TARGETS = Key(
    "target_modules",
    list[str] | None,
    None,
    "the encoder's modules the method adapts, by the last part of their name (`query`) or "
    "their path inside a block (`output.dense`); null = the method's default for the architecture",
)
RANK = Key(
    "r",
    int,
    8,
    "rank (adalora: the average rank it ends at)",
    (lambda v: v >= 1, "a positive integer"),
)
ALPHA = Key(
    "alpha",
    int,
    16,
    "adapters scaled by alpha/r (loha, lokr: their alpha)",
    (lambda v: v > 0, "positive"),
)
DROPOUT = Key(
    "dropout", float, 0.1, "dropout on the adapters' input", (lambda v: 0 <= v < 1, "in [0, 1)")
)
LORA = (RANK, ALPHA, DROPOUT, TARGETS)


def _lora(freeze: config.FreezeConfig) -> dict[str, Any]:
    return {"r": freeze.r, "lora_alpha": freeze.alpha, "lora_dropout": freeze.dropout}


def _adalora(freeze: config.FreezeConfig) -> dict[str, Any]:
    if freeze.init_r < freeze.r:
        raise AblateError(
            f"freeze.init_r={freeze.init_r} < freeze.r={freeze.r}: AdaLoRA starts at init_r and "
            "prunes down to r on average"
        )
    if freeze.tinit + freeze.tfinal >= 1:
        raise AblateError(
            f"freeze.tinit={freeze.tinit} + freeze.tfinal={freeze.tfinal} must be < 1: AdaLoRA "
            "needs steps between them to prune its budget"
        )
    return {
        "init_r": freeze.init_r,
        "target_r": freeze.r,
        "lora_alpha": freeze.alpha,
        "lora_dropout": freeze.dropout,
        "deltaT": freeze.delta_t,
        "orth_reg_weight": freeze.orth_reg_weight,
        # the run's steps are known when training starts (AdaLoraSchedule sets them); until
        # then a schedule peft accepts
        "total_step": 1,
        "tinit": 0,
        "tfinal": 0,
    }


def _adalora_schedule(model: Any, freeze: config.FreezeConfig) -> list:
    from ablate.strategies.peft_build import AdaLoraSchedule

    return [AdaLoraSchedule(model, freeze.tinit, freeze.tfinal)]


_share = (lambda v: 0 <= v < 1, "in [0, 1)")
_count = (lambda v: v >= 1, "a positive integer")
ADALORA = (
    *LORA,
    Key("init_r", int, 12, "the rank each adapter starts at", _count, added=True),
    Key(
        "tinit",
        float,
        0.0,
        "share of the run's steps before its rank budget starts to fall",
        _share,
        added=True,
    ),
    Key(
        "tfinal",
        float,
        0.0,
        "share of the run's steps, at the end, trained at the final budget",
        _share,
        added=True,
    ),
    Key("delta_t", int, 1, "steps between two reallocations of the budget", _count, added=True),
    Key(
        "orth_reg_weight",
        float,
        0.5,
        "weight of the orthogonality penalty on its singular vectors",
        (lambda v: v >= 0, ">= 0"),
        added=True,
    ),
)
FEEDFORWARD = Key(
    "feedforward_modules",
    list[str] | None,
    None,
    "targets whose input is rescaled (the rest: their output); null = the feed-forward output "
    "layer, where targeted",
    added=True,
)
D_INITIAL = Key(
    "d_initial",
    float,
    0.1,
    "initial value of its scaling vector d",
    (lambda v: v > 0, "positive"),
    added=True,
)


def _rank_alpha(freeze: config.FreezeConfig) -> dict[str, Any]:
    return {"r": freeze.r, "alpha": freeze.alpha}


# In the report's order: from the fewest weights trained to the most, LoRA's family together.
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "ln_tuning",
            "LNTuningConfig",
            (TARGETS,),
            lambda freeze: {},
            targets="norms",
            peft_targets="LNTUNING",
            kind="LayerNorm",
        ),
        Method(
            "ia3",
            "IA3Config",
            (TARGETS, FEEDFORWARD),
            lambda freeze: {},
            targets="ia3",
            peft_targets="IA3",
        ),
        Method(
            "vera",
            "VeraConfig",
            (RANK, DROPOUT, D_INITIAL, TARGETS),
            lambda freeze: {
                "r": freeze.r,
                "vera_dropout": freeze.dropout,
                "d_initial": freeze.d_initial,
            },
            peft_targets="VERA",
        ),
        Method("lora", "LoraConfig", LORA, _lora, freeze_options=("lora", "lora_qkv")),
        Method("dora", "LoraConfig", LORA, lambda freeze: {**_lora(freeze), "use_dora": True}),
        Method(
            "adalora",
            "AdaLoraConfig",
            ADALORA,
            _adalora,
            peft_targets="ADALORA",
            callbacks=_adalora_schedule,
        ),
        Method("loha", "LoHaConfig", (RANK, ALPHA, TARGETS), _rank_alpha, peft_targets="LOHA"),
        Method("lokr", "LoKrConfig", (RANK, ALPHA, TARGETS), _rank_alpha, peft_targets="LOKR"),
    )
}


def apply(model: Any, freeze: config.FreezeConfig) -> Any:
    """The strategy of every method: ``freeze.strategy``'s method on ``model`` (``peft_build``)."""
    from ablate.strategies import peft_build

    return peft_build.apply_method(model, freeze, METHODS[freeze.strategy])


def register(method: Method) -> Method:
    """Add ``method`` (a built-in, or an extension's) as the strategy of its name, declaring its
    keys (``ablate.strategies.register``); returns it."""
    from ablate import strategies

    strategies.register(strategies.Strategy(method.name, apply, method.keys, method.freeze_options))
    METHODS[method.name] = method
    return method


# The comment above ``trainer.lr`` in a peft option's file: where its default lr comes from.
LR_SOURCE = re.compile(r"#\s*default lr, not tuned here:\s*(.+)\n\s*lr:")


def untuned_lr(cfg: config.TrainCore, option: str) -> str | None:
    """For a run of a peft method (``freeze=option``) at an lr no study chose
    (neither its strategy's best, tagged ``TUNED_TAG``, nor a study's trial, tagged
    ``STUDY_TAG``), the line that says so: the option's default lr and its source
    (the comment in its file), or that the run set another; None for any other run."""
    tags = cfg.tracking.tags
    if cfg.freeze.strategy not in METHODS or config.TUNED_TAG in tags or config.STUDY_TAG in tags:
        return None
    from ablate.overrides import Repository

    lr, search = cfg.trainer.lr, f"python -m ablate.lrstudy freeze={option} picks one"
    found = LR_SOURCE.search(Repository.for_command_line([]).text("freeze", option))
    try:
        default = config.composed(f"freeze={option}").trainer.lr
    except Exception:  # an option outside conf/ (a search path): no default to name
        default = None
    if default is None or lr != default:
        known = f" (freeze={option}'s default: {default:g})" if default is not None else ""
        return f"lr {lr:g} is this run's{known}, not tuned: {search}"
    source = f" ({found[1].strip()})" if found else ""
    return f"lr {lr:g} is freeze={option}'s default{source}, not tuned: {search}"
