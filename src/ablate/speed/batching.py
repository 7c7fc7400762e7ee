"""The batching algorithms behind the speed plugins: packing windows into rows, splitting a batch
into sub-batches of similar length, cutting sorted batches, bucketing by length.

- ``pack_rows`` / ``pack_layout``: a batch's windows side by side in fewer rows, block-diagonal
  attention and positions restarting per window, so every window computes as if alone.
- ``split_by_length``: a batch as sub-batches of similar length, partitioned by ``_partition``
  (padded tokens + a per-sub-batch cost least); ``length_batches`` cuts a sorted evaluation set
  the same way.
- ``LengthBucketSampler``: batches of similar length (other batches than the plain recipe's).
- ``SHAPE_WIDTH``/``SHAPE_TOKENS`` (``trainer.round_shapes``): widths in few shapes for bf16.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from ablate.data.encode import IGNORE
from ablate.errors import AblateError
from ablate.models import anatomy

# What one more sub-batch costs, in padded tokens of MiniLM (1.77 M parameters per block):
# kernel launches, small matrix products. Splits minimising padded tokens + this x sub-batches
# were fastest on CPU here (32-64 alike). Both the overhead and a token's cost grow with the
# number of blocks run, so for other encoders it scales with 1 / parameters per block.
SUB_BATCH_COST = 64
SUB_BATCH_REFERENCE_PARAMS = 1.77e6
# A packed row of width W computes W tokens plus attention over W^2 pairs (scores, mask, softmax,
# dropout). In a MiniLM training step on CPU here the attention per slot matched a token's work
# at W ~ 250: ``pack_layout`` weighs each row's slots by 1 + W / this.
PACK_ATTENTION_WIDTH = 250
# bf16 on CPU: oneDNN builds a matmul kernel for each new matrix shape (~3 ms for AMX here, ten
# times the product itself at ~300 tokens), and packed or padded batches rarely repeat a shape.
# ``trainer.round_shapes`` pads widths to a multiple of SHAPE_WIDTH and packs rows narrower than
# SHAPE_TOKENS in groups filling that many tokens, so a handful of shapes recur all epoch.
# fp32 (MKL) has no such cost, so there it would only add padding.
SHAPE_WIDTH = 32
SHAPE_TOKENS = 128
# Evaluation in bf16 on CPU: a batch's fixed costs weigh about 4x as many tokens as in fp32 (the
# products are faster, the per-call overheads are not). Naija dev on MiniLM was fastest cut at
# 4 x SUB_BATCH_COST tokens per batch (10 % faster than 64-row batches; cut at 1x, 5 % slower).
BF16_CPU_BATCH_COST = 4


def round_up(n: int, quantum: int | None) -> int:
    return n if not quantum else -(-n // quantum) * quantum


class LengthBucketSampler(Sampler[int]):
    """Each epoch: a random permutation, sorted by length within chunks of ``mega`` batches, cut
    into batches that are then shuffled; the one short batch (if any) comes last.

    Every example once per epoch; padding 5-9 % on Naija at any size (random batches: ~63 %).
    Hand-written because transformers' ``LengthGroupedSampler`` keeps each mega-batch's batches
    in long-to-short order and, on a few hundred windows, groups only a handful of batches (28 %
    padding at 500 sentences); the DataLoader slices this index stream into batches.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, mega: int = 50, generator=None):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.mega = mega
        self.generator = generator  # None: torch's global RNG, which the Trainer seeds

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        n, size = len(self.lengths), self.mega * self.batch_size
        perm = torch.randperm(n, generator=self.generator).tolist()
        full, short = [], []
        for start in range(0, n, size):
            chunk = sorted(perm[start : start + size], key=self.lengths.__getitem__)
            for i in range(0, len(chunk), self.batch_size):
                batch = chunk[i : i + self.batch_size]
                (full if len(batch) == self.batch_size else short).append(batch)
        order = torch.randperm(len(full), generator=self.generator).tolist()
        return iter([i for b in order for i in full[b]] + [i for batch in short for i in batch])


def right_padded(inputs: Mapping) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(attention mask, row lengths) of a batch of 2+ right-padded rows; (None, None) otherwise."""
    mask = inputs.get("attention_mask")
    if mask is None or mask.dim() != 2 or mask.size(0) < 2:
        return None, None
    lengths = mask.sum(1)
    if not torch.equal(
        mask.bool(), torch.arange(mask.size(1), device=mask.device) < lengths[:, None]
    ):
        return None, None
    return mask, lengths


def split_by_length(
    inputs: Mapping, cost: int | None = None, quantum: int | None = None
) -> list[dict] | None:
    """The rows of a right-padded batch as sub-batches of similar length, each cropped to its
    longest row; the partition minimises padded tokens + ``cost`` per sub-batch. None when
    splitting would not save anything (or the batch is not right-padded).

    With ``quantum`` (``trainer.round_shapes``) every part's width is a multiple of it (the batch
    is padded first), and a batch that does not split is returned padded, as one part.
    """
    cost = SUB_BATCH_COST if cost is None else cost
    mask, lengths = right_padded(inputs)
    if mask is None:
        return None
    if quantum:
        inputs = _pad_width(inputs, round_up(mask.size(1), quantum))
        mask = inputs["attention_mask"]
    rows, width = mask.shape
    order = torch.argsort(lengths, stable=True)
    ls = [round_up(n, quantum) for n in lengths[order].tolist()]
    bounds, total = partition(ls, cost)
    if total >= rows * width + cost:
        return [dict(inputs)] if quantum else None
    parts = []
    for start, end in bounds:
        index, length = order[start:end], ls[end - 1]
        part = {}
        for key, value in inputs.items():
            if torch.is_tensor(value) and value.dim() >= 1 and value.size(0) == rows:
                value = value[index]
                if value.dim() >= 2 and value.size(1) == width:
                    value = value[:, :length].contiguous()  # models .view() their labels
            part[key] = value
        parts.append(part)
    return parts


def partition(
    lengths: Sequence[int], cost: int, max_rows: int | None = None
) -> tuple[list[tuple[int, int]], int]:
    """Cut ascending ``lengths`` into runs of at most ``max_rows`` that minimise padded tokens
    (each run padded to its last length) + ``cost`` per run: the (start, end) bounds and that
    total. An O(n * max_rows) dynamic programme; best[j] is the cheapest cut of the j first."""
    n = len(lengths)
    span = n if max_rows is None else max_rows
    best, cut = [0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - span), j):
            value = best[i] + (j - i) * lengths[j - 1] + cost
            if value < best[j]:
                best[j], cut[j] = value, i
    bounds, j = [], n
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    return bounds[::-1], best[n]


def length_batches(lengths: Sequence[int], max_rows: int, cost: int) -> list[list[int]]:
    """Indices of ``lengths`` in ascending length, in batches of at most ``max_rows``, cut where
    padded tokens + ``cost`` per batch are least (evaluation and the prefix precompute: fixed-size
    sorted batches padded MiniLM's Naija dev 22 % here; these 8 %, and ran 14 % faster in fp32)."""
    order = np.argsort(np.asarray(lengths), kind="stable").tolist()
    bounds, _ = partition([lengths[i] for i in order], cost, max_rows)
    return [order[start:end] for start, end in bounds]


def _pad_width(inputs: Mapping, width: int) -> dict:
    """Right-pad every per-token tensor of a (B, L) batch to ``width`` (labels with IGNORE)."""
    rows, length = inputs["attention_mask"].shape
    padded = {}
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.dim() >= 2 and value.shape[:2] == (rows, length):
            extra = value.new_full(
                (rows, width - length, *value.shape[2:]), IGNORE if key == "labels" else 0
            )
            value = torch.cat([value, extra], dim=1)
        padded[key] = value
    return padded


def first_fit_decreasing(lengths: list[int], width: int) -> list[list[int]]:
    """Window indices in rows of at most ``width`` tokens: first fit, longest first."""
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, room in enumerate(free):
            if room >= lengths[i]:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(width - lengths[i])
    return bins


def pack_cost(rows: int, width: int) -> float:
    """What ``rows`` packed rows of ``width`` cost, attention weighed in."""
    return rows * width * (1 + width / PACK_ATTENTION_WIDTH)


def pack_layout(lengths: list[int], quantum: int | None = None) -> tuple[list[list[int]], int]:
    """(rows of window indices, row width) for windows of ``lengths``: first-fit decreasing into
    the cheapest width, a row of width W costing W x (1 + W / PACK_ATTENTION_WIDTH).

    Rows of the longest window's width leave its remainder as padding in the last row; a few
    slightly wider rows can hold the same windows with less padding and less attention.
    With ``quantum`` (``trainer.round_shapes``) the width is a multiple of it, and rows narrower
    than ``SHAPE_TOKENS`` come in groups of ``SHAPE_TOKENS // width`` (empty rows added), so
    few row counts occur.
    """
    if quantum:
        return _rounded_layout(lengths, quantum)
    total, longest = sum(lengths), max(lengths)
    bins = first_fit_decreasing(lengths, longest)
    best = (pack_cost(len(bins), longest), bins, longest)
    for rows in range(len(bins) - 1, 0, -1):  # fewer, wider rows
        width = max(longest, -(-total // rows))
        if pack_cost(rows, width) >= best[0]:  # and fewer rows only get wider
            break
        bins = first_fit_decreasing(lengths, width)
        while len(bins) > rows and pack_cost(rows, width + 1) < best[0]:
            width += 1
            bins = first_fit_decreasing(lengths, width)
        if len(bins) <= rows:
            best = (pack_cost(len(bins), width), bins, width)
    return best[1], best[2]


def _rounded_layout(lengths: list[int], quantum: int) -> tuple[list[list[int]], int]:
    total, width = sum(lengths), round_up(max(lengths), quantum)
    best: tuple[float, list[list[int]], int] | None = None
    # rows x W >= total, so width W costs at least total x (1 + W / PACK_ATTENTION_WIDTH)
    while best is None or total * (1 + width / PACK_ATTENTION_WIDTH) < best[0]:
        bins = first_fit_decreasing(lengths, width)
        rows = round_up(len(bins), max(1, SHAPE_TOKENS // width))
        if best is None or pack_cost(rows, width) < best[0]:
            best = (pack_cost(rows, width), bins + [[] for _ in range(rows - len(bins))], width)
        if len(bins) == 1:  # wider rows only add padding
            break
        width += quantum
    return best[1], best[2]


def pack_rows(inputs: Mapping, attention: str = "sdpa", quantum: int | None = None) -> dict | None:
    """A right-padded (B, L) batch packed into R rows of width W >= L (``pack_layout``, which
    ``quantum`` is passed to), R x W < B x L unless ``quantum`` is given.

    Per-token tensors are gathered into the rows (labels padded with -100), ``position_ids``
    restart at 0 for every window, and ``attention_mask`` becomes a (R, 1, W, W) block-diagonal
    mask (bool for sdpa, additive for eager) so no token sees another window; ``_source`` (to pop
    before the forward) holds each slot's flat index into the batch's (B x L) positions, B x L for
    padding. None when the batch is not right-padded or packing would not save a slot.
    """
    mask, lengths = right_padded(inputs)
    if mask is None:
        return None
    rows, width = mask.shape
    bins, packed_width = pack_layout(lengths.tolist(), quantum)
    if len(bins) * packed_width >= rows * width and not quantum:  # rounded: a shape seen before
        return None
    return pack_into(inputs, lengths.tolist(), bins, packed_width, attention)


def pack_into(
    inputs: Mapping, lengths: list[int], bins: list[list[int]], width: int, attention: str
) -> dict | None:
    """A right-padded (B, L) batch whose windows have ``lengths`` as rows ``bins`` (window
    indices; an empty bin is a row of padding) of ``width``: what ``pack_rows`` returns."""
    mask = inputs["attention_mask"]
    rows, length = mask.shape
    pad_slot = rows * length  # one extra slot holding each key's padding value
    shape = (len(bins), width)
    source = torch.full(shape, pad_slot, dtype=torch.long)
    position = torch.zeros(shape, dtype=torch.long)
    window = torch.full(shape, -1, dtype=torch.long)  # padding: its own block
    for r, members in enumerate(bins):
        start = 0
        for i in members:
            n = lengths[i]
            source[r, start : start + n] = torch.arange(i * length, i * length + n)
            position[r, start : start + n] = torch.arange(n)
            window[r, start : start + n] = i
            start += n
    source, position, window = (t.to(mask.device) for t in (source, position, window))
    packed: dict = {}
    for key, value in inputs.items():
        if key == "attention_mask":
            continue
        if torch.is_tensor(value) and value.dim() >= 2 and value.shape[:2] == (rows, length):
            flat = value.reshape(rows * length, *value.shape[2:])
            fill = IGNORE if key == "labels" else 0
            flat = torch.cat([flat, flat.new_full((1, *flat.shape[1:]), fill)])
            packed[key] = flat[source]
        elif torch.is_tensor(value) and value.dim() >= 1 and value.size(0) == rows:
            return None  # a per-window value with no place in a packed row
        else:
            packed[key] = value
    same = (window[:, :, None] == window[:, None, :])[:, None]
    if attention == "eager":  # eager attention adds the mask to the scores
        dtype = torch.get_default_dtype()
        same = torch.zeros(same.shape, dtype=dtype, device=mask.device).masked_fill(
            ~same, torch.finfo(dtype).min
        )
    packed["attention_mask"] = same
    packed["position_ids"] = position
    packed["_source"] = source  # where each slot came from (B x L: padding); not a model input
    return packed


def sub_batch_cost(model: torch.nn.Module) -> int:
    """``SUB_BATCH_COST`` scaled to the size of the blocks a training step runs (a small model
    pays its per-sub-batch overhead in more tokens; blocks under a cached prefix, the model's
    ``first_trained_block``, do not run)."""
    try:
        blocks = anatomy.blocks(model)
    except AblateError:
        return SUB_BATCH_COST
    running = blocks[getattr(model, "first_trained_block", 0) :]
    if not len(running):
        return SUB_BATCH_COST
    params = sum(p.numel() for block in running for p in block.parameters()) / len(running)
    return max(1, round(SUB_BATCH_COST * SUB_BATCH_REFERENCE_PARAMS / max(params, 1)))


def unsort(value, order: np.ndarray):
    """Rows of ``value`` (an array or a tuple of arrays) back from sorted to dataset order."""
    if isinstance(value, (tuple, list)):
        return type(value)(unsort(v, order) for v in value)
    if isinstance(value, np.ndarray) and value.ndim and len(value) == len(order):
        out = np.empty_like(value)
        out[order] = value
        return out
    return value
