"""LoRA (peft): the encoder frozen, low-rank adapters on its attention and the head train."""

from __future__ import annotations

import warnings

from omegaconf import DictConfig
from torch import nn

from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.models.heads import BiLSTMTokenClassifier
from ablate.strategies.base import Applied, describe, train_everything

# Per architecture (``config.model_type``); others fall back to peft's own table.
LORA_TARGETS: dict[str, list[str]] = {
    **dict.fromkeys(
        ("bert", "roberta", "xlm-roberta", "electra", "camembert", "mpnet"), ["query", "value"]
    ),
    "distilbert": ["q_lin", "v_lin"],
    "deberta-v2": ["query_proj", "value_proj"],
}


def lora_targets(model: nn.Module, cfg: DictConfig) -> list[str]:
    """``freeze.target_modules``, or the architecture's default; each must name encoder Linears."""
    encoder = anatomy.encoder(model)
    linear = sorted(
        {name.rsplit(".", 1)[-1] for name, m in encoder.named_modules() if isinstance(m, nn.Linear)}
    )
    if cfg.target_modules is not None:
        targets = list(cfg.target_modules)
    else:
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

        model_type = getattr(model.config, "model_type", None)
        targets = LORA_TARGETS.get(model_type) or PEFT_TARGETS.get(model_type)
        if not targets:
            raise AblateError(
                f"freeze.target_modules: no default for model type {model_type!r}; set it to some "
                f"of the encoder's Linear layers: {', '.join(linear)}"
            )
    unknown = [t for t in targets if t not in linear]
    if not targets or unknown:
        raise AblateError(
            f"freeze.target_modules={targets}: {unknown or 'empty'}; allowed: the encoder's "
            f"Linear layers {', '.join(linear)}"
        )
    return list(targets)


def _peft_task_type(model: nn.Module):
    from peft import TaskType

    name = type(model).__name__
    if name.endswith("ForTokenClassification") or isinstance(model, BiLSTMTokenClassifier):
        return TaskType.TOKEN_CLS
    if name.endswith("ForSequenceClassification"):
        return TaskType.SEQ_CLS
    return None


def freeze_lora(model: nn.Module, cfg: DictConfig) -> Applied:
    """LoRA (peft): the encoder is frozen; rank-``r`` adapters on ``target_modules`` and the head
    train. The run's artifact ``adapter/`` holds the adapter and head only (``save_pretrained``).
    """
    from peft import LoraConfig, get_peft_model

    if cfg.r < 1:
        raise AblateError(f"freeze.r={cfg.r}: the LoRA rank must be a positive integer")
    if cfg.alpha <= 0:
        raise AblateError(f"freeze.alpha={cfg.alpha}: the LoRA scaling alpha must be positive")
    if not 0 <= cfg.dropout < 1:
        raise AblateError(f"freeze.dropout={cfg.dropout}: must be in [0, 1)")
    targets = lora_targets(model, cfg)
    train_everything(model)
    lora = LoraConfig(
        task_type=_peft_task_type(model),
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        # The whole head trains and is saved with the adapter (for the linear head peft's
        # token-classification default would pick the classifier anyway; not the BiLSTM, nor
        # BERT's pooler under a sentence head).
        modules_to_save=anatomy.head_modules(model),
    )
    with warnings.catch_warnings():
        # peft 0.21 calls a transformers 5 method that is deprecated; nothing for users to fix.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        wrapped = get_peft_model(model, lora)
    return describe(wrapped, artifacts={"adapter": wrapped.save_pretrained})
