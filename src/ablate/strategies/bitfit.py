"""BitFit: only the encoder's bias terms train (with the head)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.strategies.base import Applied, describe, train_everything

if TYPE_CHECKING:
    from ablate.config import FreezeConfig


def freeze_bitfit(model: nn.Module, freeze: FreezeConfig) -> Applied:
    """BitFit: of the encoder only the bias terms (LayerNorm's included) train; the head (with
    BERT's pooler, ``model.pooler``) trains."""
    train_everything(model)
    pooler = anatomy.pooler(model)
    head = {id(p) for p in pooler.parameters()} if pooler is not None else set()
    n_bias = 0
    for name, p in anatomy.encoder(model).named_parameters():
        if id(p) not in head:  # the pooler is part of the head (model.pooler)
            p.requires_grad = name.rsplit(".", 1)[-1] == "bias"
            n_bias += p.requires_grad
    if not n_bias:
        raise AblateError(
            f"freeze.strategy=bitfit: {type(model).__name__}'s encoder has no bias terms to train"
        )
    return describe(model)
