"""Freezing whole transformer blocks (and optionally the embeddings): ``all``, ``first``,
``last``, ``every``, ``layers`` combine as a union (``freeze=first4``, ``alt``, ...)."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.strategies.base import Applied, describe, train_everything


def frozen_block_indices(cfg: DictConfig, n_blocks: int) -> list[int]:
    """The union of the block selectors in ``cfg``, checked against the model's ``n_blocks``."""
    for key in ("first", "last", "every"):
        value = cfg[key]
        if value < 0 or value > n_blocks or (key == "every" and value > 0 and n_blocks == 0):
            raise AblateError(f"freeze.{key}={value}: must be between 0 and {n_blocks} (blocks)")
    bad = [i for i in cfg.layers if not 0 <= i < n_blocks]
    if bad:
        raise AblateError(
            f"freeze.layers: block(s) {bad} do not exist; the model has {n_blocks} blocks "
            f"(0..{n_blocks - 1})"
        )
    chosen = set(cfg.layers)
    if cfg.all:
        chosen.update(range(n_blocks))
    chosen.update(range(cfg.first))
    chosen.update(range(n_blocks - cfg.last, n_blocks))
    if cfg.every:
        chosen.update(range(0, n_blocks, cfg.every))
    return sorted(chosen)


def freeze_layers(model: nn.Module, cfg: DictConfig) -> Applied:
    """Freeze whole transformer blocks (and optionally the embeddings); everything else trains."""
    blocks = anatomy.blocks(model)
    frozen = frozen_block_indices(cfg, len(blocks))
    train_everything(model)
    for i in frozen:
        blocks[i].requires_grad_(False)
    if cfg.embeddings:
        anatomy.embeddings(model).requires_grad_(False)
    return describe(model)
