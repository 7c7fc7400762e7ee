"""Freezing strategies: functions that decide which parameters train (``conf/freeze``).

A strategy takes the built model and the ``freeze`` config, sets ``requires_grad``, and returns a
description of what it did. New strategies register in ``STRATEGIES``; the classifier head
always trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from omegaconf import DictConfig
from torch import nn

from ablate import model as model_lib
from ablate.errors import AblateError


@dataclass
class Applied:
    """What a strategy froze, and the resulting parameter counts."""

    trainable_params: int
    total_params: int
    frozen_blocks: list[int] = field(default_factory=list)
    embeddings_frozen: bool = False

    @property
    def trainable_pct(self) -> float:
        return 100.0 * self.trainable_params / self.total_params


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
    blocks = model_lib.blocks(model)
    frozen = frozen_block_indices(cfg, len(blocks))
    for p in model.parameters():
        p.requires_grad = True
    for i in frozen:
        blocks[i].requires_grad_(False)
    if cfg.embeddings:
        model_lib.embeddings(model).requires_grad_(False)
    trainable, total = model_lib.count_params(model)
    return Applied(trainable, total, frozen, bool(cfg.embeddings))


STRATEGIES: dict[str, Callable[[nn.Module, DictConfig], Applied]] = {
    "layers": freeze_layers,
}


def apply(model: nn.Module, cfg: DictConfig) -> Applied:
    """Run the strategy named by ``freeze.strategy`` on ``model``."""
    if cfg.strategy not in STRATEGIES:
        raise AblateError(
            f"freeze.strategy={cfg.strategy!r} is not one of {', '.join(sorted(STRATEGIES))}"
        )
    return STRATEGIES[cfg.strategy](model, cfg)
