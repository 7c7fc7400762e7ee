"""Layer-wise learning-rate decay: everything trains, lower blocks at smaller learning rates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ablate.models import anatomy
from ablate.strategies.base import Applied, ParamGroup, describe
from ablate.strategies.layers import freeze_layers

if TYPE_CHECKING:
    from ablate.config import FreezeConfig


def freeze_llrd(model: nn.Module, freeze: FreezeConfig) -> Applied:
    """Layer-wise lr decay: block i of n gets lr x decay^(n-1-i), the embeddings lr x decay^n.

    The head and the top block train at the full lr. The layer selectors still apply (default:
    nothing frozen), so ``freeze.first=2`` with llrd freezes blocks 0-1 and decays the rest.
    ``freeze.decay`` is checked with its declaration (``ablate.strategies``).
    """
    freeze_layers(model, freeze)
    blocks = anatomy.blocks(model)
    n = len(blocks)
    parts = {f"block{i}": (blocks[i], freeze.decay ** (n - 1 - i)) for i in reversed(range(n))}
    parts["embeddings"] = (anatomy.embeddings(model), freeze.decay**n)
    owner = {id(p): name for name, (module, _) in parts.items() for p in module.parameters()}
    # The head's group first, then top to bottom: the Trainer logs the first group's lr.
    names: dict[str, list[str]] = {"head": [], **{name: [] for name in parts}}
    for pname, p in model.named_parameters():
        if p.requires_grad:
            names[owner.get(id(p), "head")].append(pname)
    scale = {"head": 1.0, **{name: s for name, (_, s) in parts.items()}}
    groups = [ParamGroup(name, params, scale[name]) for name, params in names.items() if params]
    return describe(model, param_groups=groups)
