"""Training batches in a few fixed shapes, for a step captured once per shape
(``trainer.cuda_graph``): each random batch's windows are packed side by side (block-diagonal
attention, positions restarting per window: ``batching.pack_into``) into the cheapest of a fixed
set of (rows, width), padding rows and slots as needed. The packing runs in the collator, on the
host, so the device never computes a layout (no host sync in the step).

The set (``Shapes.for_batches``): widths of 32 doubling up to the longest window (rounded up to
32), rows in powers of two up to the batch size: for MiniLM's Naija batches of 16 windows of at
most 128 tokens, 3 widths x 5 row counts, of which a few recur all epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ablate.speed import batching


@dataclass(frozen=True)
class Shapes:
    """The (rows, width) shapes training batches come in."""

    rows: tuple[int, ...]
    widths: tuple[int, ...]

    @classmethod
    def for_batches(cls, batch_size: int, max_length: int) -> Shapes:
        """Rows 1, 2, 4, ... up to ``batch_size`` (itself included); widths 32, 64, ... up to
        ``max_length`` rounded up to a multiple of 32 (itself included)."""
        rows = _doubling(1, batch_size)
        widest = batching.round_up(max_length, batching.SHAPE_WIDTH)
        widths = _doubling(batching.SHAPE_WIDTH, widest)
        return cls(rows, widths)

    def layout(self, lengths: list[int]) -> tuple[list[list[int]], int]:
        """Windows of ``lengths`` as (rows of window indices, width), the rows padded with empty
        ones to a count of ``rows``: the shape of least cost (a row of width W costing
        W x (1 + W / PACK_ATTENTION_WIDTH), ``batching``'s weight of attention)."""
        best: tuple[float, list[list[int]], int] | None = None
        for width in self.widths:
            if width < max(lengths):
                continue
            bins = batching.first_fit_decreasing(lengths, width)
            rows = next((r for r in self.rows if r >= len(bins)), None)
            if rows is None:
                continue
            cost = batching.pack_cost(rows, width)
            if best is None or cost < best[0]:
                best = (cost, bins + [[] for _ in range(rows - len(bins))], width)
        if best is None:
            raise ValueError(
                f"windows of {max(lengths)} tokens, {len(lengths)} of them, fit none of the "
                f"shapes (rows {self.rows}, widths {self.widths})"
            )
        return best[1], best[2]


def _doubling(start: int, end: int) -> tuple[int, ...]:
    values = []
    while start < end:
        values.append(start)
        start *= 2
    return (*values, end)


def fixed(inputs: dict, shapes: Shapes, attention: str) -> dict:
    """A right-padded (B, L) batch packed into the cheapest of ``shapes`` (``_source``: each
    slot's flat index into the (B x L) batch, B x L for padding; not a model input)."""
    mask = inputs["attention_mask"]
    lengths = mask.sum(1).tolist()
    bins, width = shapes.layout(lengths)
    packed = batching.pack_into(inputs, lengths, bins, width, attention)
    if packed is None:
        raise ValueError("a per-window input has no place in a packed row")
    return packed


class FixedShapeCollator:
    """Wraps the training collator: its padded batches packed into ``shapes`` (``fixed``);
    with ``stats`` (the meter's), counts the rows computed."""

    def __init__(self, inner: Callable, shapes: Shapes, attention: str):
        self.inner, self.shapes, self.attention = inner, shapes, attention
        self.stats = None

    def __call__(self, features: list[dict]) -> dict:
        batch = self.inner(features)
        packed = fixed(batch, self.shapes, self.attention)
        source = packed.pop("_source")
        if self.stats is not None:
            self.stats.add({"attention_mask": source < batch["attention_mask"].numel()})
        return packed


def shape_of(batch: dict) -> tuple:
    """What a captured step is keyed by: each tensor's name, shape and dtype."""
    return tuple(
        (k, tuple(v.shape), v.dtype) for k, v in sorted(batch.items()) if torch.is_tensor(v)
    )
