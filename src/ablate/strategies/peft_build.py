"""A peft method (``peft_methods.METHODS``) built on a model: its targets resolved to the
encoder's modules, its peft config made and the model wrapped; the encoder frozen, the method's
modules and the whole head train."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from torch import nn
from transformers import TrainerCallback

from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.models.heads import BiLSTMTokenClassifier
from ablate.strategies.base import Applied, describe, train_everything

if TYPE_CHECKING:
    from ablate.config import FreezeConfig
    from ablate.strategies.peft_spec import Method


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


def targets(model: nn.Module, freeze: FreezeConfig, method: Method) -> list[str]:
    """``freeze.target_modules``, or the method's default for the architecture, resolved."""
    names = freeze.target_modules
    if names is None:
        names = _defaults(model, method.targets, f"{method.peft_targets}_TARGET")
        if not names:
            kind = getattr(nn, method.kind)
            allowed = sorted(set().union(*anatomy.target_names(model, kind).values()))
            raise AblateError(
                f"freeze.target_modules: {method.name} has no default for model type "
                f"{getattr(model.config, 'model_type', None)!r}; set it to some of the "
                f"encoder's {method.kind} layers: {', '.join(allowed)}"
            )
    return resolve(model, list(names), getattr(nn, method.kind))


def _feedforward(model: nn.Module, freeze: FreezeConfig, chosen: list[str]) -> list[str]:
    """(IA)^3's ``feedforward_modules``: set, a subset of the targets; null, the architecture's
    feed-forward output layer where targeted."""
    if freeze.feedforward_modules is None:
        names = _defaults(model, "ia3_feedforward", "IA3_FEEDFORWARD") or []
        return [n for n in resolve(model, names, nn.Linear) if n in chosen] if names else []
    ff = resolve(model, list(freeze.feedforward_modules), nn.Linear, "feedforward_modules")
    if not set(ff) <= set(chosen):
        raise AblateError(
            f"freeze.feedforward_modules={list(freeze.feedforward_modules)} must name targets "
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


def apply_method(model: nn.Module, freeze: FreezeConfig, method: Method) -> Applied:
    """``method`` on ``model`` through peft: the encoder frozen, the method's modules on its
    targets and the whole head train; the run's ``adapter/`` artifact holds them."""
    import peft

    options = method.options(freeze)
    chosen = targets(model, freeze, method)
    if "feedforward_modules" in method.key_names:
        options["feedforward_modules"] = _feedforward(model, freeze, chosen)
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
    callbacks = [lambda record, c=c: c for c in method.callbacks(wrapped, freeze)]
    between = f"{method.name} acts between steps (its schedule)" if callbacks else None
    return describe(
        wrapped,
        artifacts={"adapter": wrapped.save_pretrained},
        callbacks=callbacks,
        eager_steps=between,
    )
