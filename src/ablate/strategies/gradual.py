"""Gradual unfreezing: the head first, then one more block from the top each epoch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn
from transformers import TrainerCallback

from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.strategies.base import Applied, ParamGroup, describe, train_everything

if TYPE_CHECKING:
    from ablate.config import FreezeConfig


class GradualUnfreezing(TrainerCallback):
    """Trainer callback: at the start of epoch e, the top ``schedule[e]`` blocks train.

    ``schedule`` holds one count per epoch (the last holds for later epochs); ``n_blocks + 1``
    unfreezes the whole encoder, embeddings included. The head always trains. Each epoch's
    trainable count is logged with step = epoch (1..N).
    """

    def __init__(self, model: nn.Module, schedule: Sequence[int]):
        self.model = model
        self.schedule = list(schedule)
        self.run: Any = None

    def with_run(self, run: Any) -> GradualUnfreezing:
        self.run = run
        return self

    def set_epoch(self, epoch: int) -> int:
        """Apply the schedule of 0-based ``epoch``; returns the number of top blocks training."""
        blocks = anatomy.blocks(self.model)
        k = self.schedule[min(epoch, len(self.schedule) - 1)]
        anatomy.encoder(self.model).requires_grad_(k > len(blocks))
        for i, block in enumerate(blocks):
            block.requires_grad_(i >= len(blocks) - k)
        pooler = anatomy.pooler(self.model)
        if pooler is not None:  # part of the head (model.pooler), which always trains
            pooler.requires_grad_(True)
        return k

    def on_epoch_begin(self, args, state, control, **kwargs):
        epoch = int(round(state.epoch or 0))  # epochs done: a resumed run starts past 0
        self.set_epoch(epoch)
        if self.run is not None:
            trainable, total = anatomy.count_params(self.model)
            self.run.metrics(
                {"trainable_params": trainable, "trainable_pct": 100.0 * trainable / total},
                step=epoch + 1,
            )


def freeze_gradual(model: nn.Module, freeze: FreezeConfig) -> Applied:
    """Gradual unfreezing: the head first, then one more block from the top per epoch.

    The optimiser holds every parameter from the start (frozen ones simply get no gradient), so
    blocks unfrozen later train.
    """
    n = len(anatomy.blocks(model))
    schedule = list(range(n + 2)) if freeze.schedule is None else list(freeze.schedule)
    bad = [k for k in schedule if not 0 <= k <= n + 1]
    if not schedule or bad or schedule != sorted(schedule):
        raise AblateError(
            f"freeze.schedule={schedule}: must be a non-empty, non-decreasing list of top-block "
            f"counts per epoch, each between 0 and {n + 1} ({n} blocks; {n + 1} = also the "
            f"embeddings)"
        )
    train_everything(model)
    unfreezing = GradualUnfreezing(model, schedule)
    unfreezing.set_epoch(0)
    everything = ParamGroup("all", [name for name, _ in model.named_parameters()])
    # each epoch's unfreezing changes what the compiled graph computes: a recompile per epoch and
    # batch shape, and past torch's recompile limit the model runs eagerly anyway
    eager = "its trainable blocks change every epoch, and each change would recompile the model"
    return describe(
        model, param_groups=[everything], callbacks=[unfreezing.with_run], eager_only=eager
    )
