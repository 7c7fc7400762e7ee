"""Parameter-efficient methods built through peft: LoRA, DoRA, AdaLoRA, LoHa, LoKr, VeRA, (IA)^3
and LN tuning, one strategy each (``freeze.strategy`` names the method).

Every method freezes the encoder, adds (or, LN tuning, copies) the modules it trains on the
encoder's ``target_modules`` and trains them with the whole head. The run's artifact
``adapter/`` holds what trained and nothing else (peft's ``save_pretrained``).

Prefix tuning (P-tuning v2) and prompt tuning are not here: see docs/tasks-and-strategies.md.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig
from torch import nn
from transformers import TrainerCallback

from ablate import config
from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.models.heads import BiLSTMTokenClassifier
from ablate.strategies.base import Applied, describe, train_everything

# What each key must be, for the methods that read it: (test, the allowed values in words).
CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "r": (lambda v: v >= 1, "a positive integer"),
    "alpha": (lambda v: v > 0, "positive"),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "init_r": (lambda v: v >= 1, "a positive integer"),
    "tinit": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "tfinal": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "delta_t": (lambda v: v >= 1, "a positive integer"),
    "orth_reg_weight": (lambda v: v >= 0, ">= 0"),
    "d_initial": (lambda v: v > 0, "positive"),
}


@dataclass(frozen=True)
class Method:
    """A peft method: its config class, the ``freeze`` keys it reads, what its targets are, and
    its config's arguments from those keys."""

    name: str
    config: str  # the peft config class
    keys: tuple[str, ...]
    options: Callable[[DictConfig], dict[str, Any]]
    targets: str = "attention"  # its default target_modules: a kind of anatomy.TARGETS
    peft_targets: str = "LORA"  # peft's table for other architectures
    kind: type[nn.Module] = nn.Linear  # what its targets must be
    callbacks: Callable[[nn.Module, DictConfig], list] = field(default=lambda model, cfg: [])


def _lora(cfg: DictConfig) -> dict[str, Any]:
    return {"r": cfg.r, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout}


def _adalora(cfg: DictConfig) -> dict[str, Any]:
    if cfg.init_r < cfg.r:
        raise AblateError(
            f"freeze.init_r={cfg.init_r} < freeze.r={cfg.r}: AdaLoRA starts at init_r and prunes "
            "down to r on average"
        )
    if cfg.tinit + cfg.tfinal >= 1:
        raise AblateError(
            f"freeze.tinit={cfg.tinit} + freeze.tfinal={cfg.tfinal} must be < 1: AdaLoRA needs "
            "steps between them to prune its budget"
        )
    return {
        "init_r": cfg.init_r, "target_r": cfg.r, "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout, "deltaT": cfg.delta_t, "orth_reg_weight": cfg.orth_reg_weight,
        # the run's steps are known when training starts (AdaLoraSchedule sets them); until
        # then a schedule peft accepts
        "total_step": 1, "tinit": 0, "tfinal": 0,
    }  # fmt: skip


class AdaLoraSchedule(TrainerCallback):
    """AdaLoRA's rank budget over the run: ``total_step``, ``tinit`` and ``tfinal`` from the
    Trainer's step count when training starts, and peft's ``update_and_allocate`` after every
    optimiser step, while the gradients it scores are still there. Steps count from 1, so the
    budget reaches its target (``r`` per adapter on average) at step ``total - tfinal``."""

    def __init__(self, model: nn.Module, tinit: float, tfinal: float):
        self.model, self.tinit, self.tfinal = model, tinit, tfinal

    def on_train_begin(self, args, state, control, **kwargs):
        config = self.model.peft_config[self.model.active_adapter]
        config.total_step = state.max_steps
        config.tinit = int(self.tinit * state.max_steps)
        config.tfinal = int(self.tfinal * state.max_steps)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.model.base_model.update_and_allocate(state.global_step + 1)


LORA_KEYS = ("r", "alpha", "dropout", "target_modules")
ADALORA_KEYS = (*LORA_KEYS, "init_r", "tinit", "tfinal", "delta_t", "orth_reg_weight")

# fmt: off
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("lora", "LoraConfig", LORA_KEYS, _lora),
    Method("dora", "LoraConfig", LORA_KEYS, lambda cfg: {**_lora(cfg), "use_dora": True}),
    Method("adalora", "AdaLoraConfig", ADALORA_KEYS, _adalora, peft_targets="ADALORA",
           callbacks=lambda model, cfg: [AdaLoraSchedule(model, cfg.tinit, cfg.tfinal)]),
    Method("loha", "LoHaConfig", ("r", "alpha", "target_modules"),
           lambda cfg: {"r": cfg.r, "alpha": cfg.alpha}, peft_targets="LOHA"),
    Method("lokr", "LoKrConfig", ("r", "alpha", "target_modules"),
           lambda cfg: {"r": cfg.r, "alpha": cfg.alpha}, peft_targets="LOKR"),
    Method("vera", "VeraConfig", ("r", "dropout", "d_initial", "target_modules"),
           lambda cfg: {"r": cfg.r, "vera_dropout": cfg.dropout, "d_initial": cfg.d_initial},
           peft_targets="VERA"),
    Method("ia3", "IA3Config", ("target_modules", "feedforward_modules"), lambda cfg: {},
           targets="ia3", peft_targets="IA3"),
    Method("ln_tuning", "LNTuningConfig", ("target_modules",), lambda cfg: {}, targets="norms",
           peft_targets="LNTUNING", kind=nn.LayerNorm),
)}
# fmt: on


# The comment above ``trainer.lr`` in a peft option's file: where its default lr comes from.
LR_SOURCE = re.compile(r"#\s*default lr, not tuned here:\s*(.+)\n\s*lr:")


def untuned_lr(cfg: DictConfig, option: str) -> str | None:
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


def _defaults(model: nn.Module, kind: str, peft_table: str) -> list[str] | None:
    """The architecture's default names of ``kind`` (``anatomy.TARGETS``), else peft's."""
    from peft.utils import constants

    model_type = getattr(model.config, "model_type", None)
    table = getattr(constants, f"TRANSFORMERS_MODELS_TO_{peft_table}_MODULES_MAPPING", {})
    return anatomy.TARGETS[kind].get(model_type) or table.get(model_type)


def resolve(
    model: nn.Module, names: list[str], kind: type[nn.Module], key: str = "target_modules"
) -> list[str]:
    """The full names (in the task model) of the encoder's ``kind`` modules that ``names``
    name (``anatomy.target_names``); every name must name one."""
    found = anatomy.target_names(model, kind)
    allowed = sorted(set().union(*found.values()))
    unknown = [n for n in names if n not in allowed]
    if not names or unknown:
        raise AblateError(
            f"freeze.{key}={list(names)}: {unknown or 'empty'}; allowed: the encoder's "
            f"{kind.__name__} layers by name or path in a block: {', '.join(allowed)}"
        )
    return [full for full, aliases in found.items() if aliases & set(names)]


def targets(model: nn.Module, cfg: DictConfig, method: Method) -> list[str]:
    """``freeze.target_modules``, or the method's default for the architecture, resolved."""
    names = cfg.target_modules
    if names is None:
        names = _defaults(model, method.targets, f"{method.peft_targets}_TARGET")
        if not names:
            allowed = sorted(set().union(*anatomy.target_names(model, method.kind).values()))
            raise AblateError(
                f"freeze.target_modules: {method.name} has no default for model type "
                f"{getattr(model.config, 'model_type', None)!r}; set it to some of the "
                f"encoder's {method.kind.__name__} layers: {', '.join(allowed)}"
            )
    return resolve(model, list(names), method.kind)


def _feedforward(model: nn.Module, cfg: DictConfig, chosen: list[str]) -> list[str]:
    """(IA)^3's ``feedforward_modules``: set, a subset of the targets; null, the architecture's
    feed-forward output layer where targeted."""
    if cfg.feedforward_modules is None:
        names = _defaults(model, "ia3_feedforward", "IA3_FEEDFORWARD") or []
        return [n for n in resolve(model, names, nn.Linear) if n in chosen] if names else []
    ff = resolve(model, list(cfg.feedforward_modules), nn.Linear, "feedforward_modules")
    if not set(ff) <= set(chosen):
        raise AblateError(
            f"freeze.feedforward_modules={list(cfg.feedforward_modules)} must name targets "
            f"(freeze.target_modules) only"
        )
    return ff


def _peft_task_type(model: nn.Module):
    from peft import TaskType

    name = type(model).__name__
    if name.endswith("ForTokenClassification") or isinstance(model, BiLSTMTokenClassifier):
        return TaskType.TOKEN_CLS
    if name.endswith("ForSequenceClassification"):
        return TaskType.SEQ_CLS
    return None


def check(cfg: DictConfig, method: Method) -> None:
    """Refuse a value of one of ``method``'s keys outside what it allows (``CHECKS``)."""
    for k in method.keys:
        if k in CHECKS and not CHECKS[k][0](cfg[k]):
            raise AblateError(
                f"freeze.{k}={cfg[k]}: must be {CHECKS[k][1]} (freeze.strategy={method.name})"
            )


def apply_method(model: nn.Module, cfg: DictConfig, method: Method) -> Applied:
    """``method`` on ``model`` through peft: the encoder frozen, the method's modules on its
    targets and the whole head train; the run's ``adapter/`` artifact holds them."""
    import peft

    check(cfg, method)
    options = method.options(cfg)
    chosen = targets(model, cfg, method)
    if "feedforward_modules" in method.keys:
        options["feedforward_modules"] = _feedforward(model, cfg, chosen)
    train_everything(model)
    config = getattr(peft, method.config)(
        task_type=_peft_task_type(model),
        target_modules=chosen,
        # The whole head trains and is saved with the adapter (for the linear head peft's
        # token-classification default would pick the classifier anyway; not the BiLSTM, nor
        # BERT's pooler under a sentence head).
        modules_to_save=anatomy.head_modules(model),
        **options,
    )
    with warnings.catch_warnings():
        # peft 0.21 calls a transformers 5 method that is deprecated; nothing for users to fix.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        # LN tuning asks for a LayerNorm's in/out features, which peft reads off Linears only
        warnings.filterwarnings("ignore", "Unsupported layer type .*LayerNorm")
        wrapped = peft.get_peft_model(model, config)
    callbacks = [lambda record, c=c: c for c in method.callbacks(wrapped, cfg)]
    return describe(wrapped, artifacts={"adapter": wrapped.save_pretrained}, callbacks=callbacks)
