"""``trainer.embedding_rows``: train only the word-embedding rows that the training data uses.

A token id that never occurs in the training windows gets a zero gradient at every step, and
AdamW then only decays its row: Adam's moments of that row stay zero, so the update is
``p * (1 - lr * weight_decay)``. Yet the full table's dense gradient is filled, clipped and
stepped through every step: on MiniLM the word embeddings are half of all parameters (11.7 M of
22.7 M), and the whole Naija training set uses 4001 of their 30522 rows.

``RowsEmbedding`` keeps the table as it was, frozen, and trains a copy of the used rows; the
other rows are read through one shared scale that the optimiser's step multiplies by
``1 - lr * weight_decay`` of the rows' parameter group. Outputs and updates are the full table's
up to float rounding. It applies to strategies that leave the word embeddings trainable with the
Trainer's own optimiser groups and no callbacks (``none``, first/last k, alternating); the tag
``speed.embedding_rows`` says how many rows train, or why it did not apply. Its state dict (and
so a checkpoint) holds the full table as the dense update would have left it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import TrainerCallback

from ablate.models import anatomy
from ablate.plugins import Context, Plugin
from ablate.speed import graphs


class RowsEmbedding(nn.Embedding):
    """An ``nn.Embedding`` whose rows ``rows`` train (``trained``); the others, in the frozen
    ``weight``, are read times ``scale`` (their weight decay so far)."""

    def __init__(self, embedding: nn.Embedding, rows: torch.Tensor):
        num, dim = embedding.weight.shape
        super().__init__(num, dim, padding_idx=embedding.padding_idx, _weight=embedding.weight.data)
        self.weight.requires_grad_(False)
        rows = torch.unique(rows.to(torch.long))
        if embedding.padding_idx is not None:  # its gradient is always zero in nn.Embedding
            rows = rows[rows != embedding.padding_idx]
        self.trained = nn.Parameter(embedding.weight.data[rows].clone())
        slot = torch.full((num,), -1, dtype=torch.long)
        slot[rows] = torch.arange(rows.numel())
        self.register_buffer("rows", rows)
        self.register_buffer("slot", slot)
        # float64: a per-step factor of 1 - 5e-7 is below fp32's resolution near 1
        self.register_buffer("scale", torch.ones((), dtype=torch.float64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rest = F.embedding(ids, self.weight) * self.scale.to(self.weight.dtype)
        slot = self.slot[ids]
        used = F.embedding(slot.clamp(min=0), self.trained)
        return torch.where((slot >= 0).unsqueeze(-1), used, rest)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        # A checkpoint holds the table the dense update would have left, with the decay folded
        # in (scale 1): ``from_pretrained`` of a plain model then loads the trained embeddings,
        # and loading it back here (resume) reads the same rows.
        destination[prefix + "weight"] = self.merged()
        destination[prefix + "scale"] = torch.ones_like(self.scale)

    def decay(self, factor: float) -> None:
        """Apply one step's weight decay ``factor`` to the rows that do not train."""
        self.scale.mul_(factor)

    def merged(self) -> torch.Tensor:
        """The full table as the dense update would have left it."""
        table = self.weight.detach() * self.scale.to(self.weight.dtype)
        table[self.rows] = self.trained.detach()
        return table


class DecayUntrainedRows(TrainerCallback):
    """After every optimiser step: the decay AdamW gave the rows that do not train."""

    def __init__(self, embedding: RowsEmbedding):
        self.embedding = embedding
        self.hooked = None

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is None or self.hooked is optimizer:
            return
        trained = self.embedding.trained
        group = next(g for g in optimizer.param_groups if any(p is trained for p in g["params"]))

        def step_hook(*_):
            self.embedding.decay(1.0 - group["lr"] * group["weight_decay"])

        # The Trainer wraps the optimiser (accelerate); the hook sits on the torch optimiser.
        inner = getattr(optimizer, "optimizer", optimizer)
        inner.register_step_post_hook(step_hook)
        self.hooked = optimizer


def skip_reason(model: nn.Module, applied) -> str | None:
    """Why ``trainer.embedding_rows`` cannot apply to this model and strategy, or None."""
    if applied.param_groups is not None or applied.callbacks:
        return "the strategy sets its own optimiser groups or callbacks"
    embedding = anatomy.unwrap(model).get_input_embeddings()
    if type(embedding) is not nn.Embedding:
        return f"input embeddings are a {type(embedding).__name__}, not an nn.Embedding"
    if not embedding.weight.requires_grad:
        return "the word embeddings are frozen"
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        return "the word embeddings use max_norm, scale_grad_by_freq or sparse gradients"
    return None


def used_ids(features: Sequence[dict]) -> torch.Tensor:
    """Every token id of the training windows."""
    return torch.unique(torch.cat([torch.as_tensor(f["input_ids"]).flatten() for f in features]))


def apply(model: nn.Module, features: Sequence[dict]) -> RowsEmbedding:
    """Swap ``model``'s word embeddings for a ``RowsEmbedding`` training the rows ``features``
    use; returns it (its ``DecayUntrainedRows`` callback must join the Trainer)."""
    inner = anatomy.unwrap(model)
    embedding = inner.get_input_embeddings()
    rows = RowsEmbedding(embedding, used_ids(features))
    parent, name = anatomy.owner(inner, embedding)
    setattr(parent, name, rows)
    return rows


class EmbeddingRows(Plugin):
    name = "embedding_rows"
    switches = ("trainer.embedding_rows",)

    def prepare(self, ctx: Context) -> dict[str, str]:
        if not ctx.value("trainer.embedding_rows"):
            return {"embedding_rows": "off"}
        reason = skip_reason(ctx.model, ctx.applied)
        if reason is None and ctx.value("trainer.cuda_graph") and graphs.why_eager(ctx) is None:
            reason = "the captured step trains the whole table (trainer.cuda_graph)"
        if reason is not None:
            return {"embedding_rows": f"not applied: {reason}"}
        rows = apply(ctx.model, ctx.features["train"])
        ctx.callbacks.append(DecayUntrainedRows(rows))
        return {"embedding_rows": f"{rows.rows.numel()} of {rows.num_embeddings} rows train"}
