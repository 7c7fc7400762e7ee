"""Freezing whole transformer blocks (and optionally the embeddings): ``all``, ``first``,
``last``, ``every``, ``layers`` combine as a union (``freeze=first4``, ``alt``, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.strategies.base import Applied, describe, train_everything

if TYPE_CHECKING:
    from ablate.config import FreezeConfig


def frozen_block_indices(freeze: FreezeConfig, n_blocks: int) -> list[int]:
    """The union of the block selectors in ``freeze``, checked against the model's ``n_blocks``."""
    for key in ("first", "last", "every"):
        value = freeze[key]
        if value < 0 or value > n_blocks or (key == "every" and value > 0 and n_blocks == 0):
            raise AblateError(f"freeze.{key}={value}: must be between 0 and {n_blocks} (blocks)")
    bad = [i for i in freeze.layers if not 0 <= i < n_blocks]
    if bad:
        raise AblateError(
            f"freeze.layers: block(s) {bad} do not exist; the model has {n_blocks} blocks "
            f"(0..{n_blocks - 1})"
        )
    chosen = set(freeze.layers)
    if freeze.all:
        chosen.update(range(n_blocks))
    chosen.update(range(freeze.first))
    chosen.update(range(n_blocks - freeze.last, n_blocks))
    if freeze.every:
        chosen.update(range(0, n_blocks, freeze.every))
    return sorted(chosen)


def freeze_layers(model: nn.Module, freeze: FreezeConfig) -> Applied:
    """Freeze whole transformer blocks (and optionally the embeddings); everything else trains."""
    blocks = anatomy.blocks(model)
    frozen = frozen_block_indices(freeze, len(blocks))
    train_everything(model)
    for i in frozen:
        blocks[i].requires_grad_(False)
    if freeze.embeddings:
        anatomy.embeddings(model).requires_grad_(False)
    return describe(model)
