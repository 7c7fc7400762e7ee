"""The speed switches of ``conf/trainer``, the Trainer that applies them, and their meters.

- ``trainer.length_grouping``: ``pack`` (default) keeps the plain recipe's random batches but
  packs each batch's windows side by side into fewer rows (``pack_rows``, ``pack_layout``):
  block-diagonal attention and positions restarting per window give every token the logits it
  has alone, so the loss and gradient are the batch's, with ~3 % padding instead of ~60 %.
  Models it cannot pack (sentence heads, the BiLSTM head, relative positions) fall back to
  ``split``: each batch computed as sub-batches of similar length
  (``split_by_length``), the same gradient at a per-sub-batch overhead. ``bucket`` forms the
  batches themselves from windows of similar length (``LengthBucketSampler``): other batches,
  which cost accuracy early in training (README "Speed"). ``off``: padded random batches.
- ``trainer.fused_adamw``: the same AdamW update in one fused kernel (CPU and GPU). On CPU the
  default per-parameter loop re-reads every weight several times: on MiniLM it took most of a
  full fine-tuning step.
- ``trainer.embedding_rows``: only the word-embedding rows the training data uses train, with the
  full table's update (``ablate.embedding_rows``).
- ``trainer.fast_dropout``: CPU dropout masks from int32 draws, the same distribution at a third
  of ``bernoulli_``'s cost (``ablate.dropout``).
- ``trainer.sorted_eval``: dev/test sorted by length and cut into batches where padding plus a
  per-batch cost is least (``length_batches``); predictions are returned in the dataset's order.
  Every prediction step runs under ``torch.inference_mode()``; with bf16, under ``no_grad`` in
  one autocast region for the whole evaluation, so each weight is cast once.
- ``trainer.cache_frozen`` / ``trainer.cache_frozen_eval``: the output of a frozen prefix of the
  encoder computed once for the training windows / kept from the dev windows' first evaluation
  (``ablate.prefix``).
- ``trainer.bf16`` (null = on for a GPU that has it, off on CPU; ``true`` on a CPU with AVX-512
  BF16/AMX is opt-in: it changes the numerics), ``trainer.tf32`` and ``trainer.pin_memory``
  (GPU only).
- ``trainer.round_shapes`` (null = on for bf16 on a CPU): packed and split training batches in
  few shapes, since oneDNN builds its bf16 matmul kernels per shape (``SHAPE_WIDTH``).

``SpeedMeter`` logs per epoch the real (non-pad) training tokens, their rate, the padding share
and the dev evaluation time; with ``trainer.measure_flops`` also the training FLOPs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Sampler, SequentialSampler
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import EvalLoopOutput, has_length

from ablate import dropout
from ablate.errors import AblateError
from ablate.labels import IGNORE

log = logging.getLogger(__name__)

# Per-example keys that are not model inputs to pad but scalars to stack (prefix.py's cache
# indices: training and dev windows).
PASSTHROUGH = ("prefix_index", "eval_index")
LENGTH_GROUPING = ("pack", "split", "bucket", "off")
# Encoders whose embeddings take absolute ``position_ids`` counted from 0 and whose attention
# takes a 4-D mask as given: a packed row then computes each window exactly as alone.
PACKABLE_MODEL_TYPES = ("bert", "distilbert")
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


def training_kwargs(
    t: DictConfig,
    cuda: bool | None = None,
    bf16_ok: bool | None = None,
    tf32_ok: bool | None = None,
) -> dict[str, Any]:
    """TrainingArguments for ``trainer``'s speed switches on this machine (or the one described).

    ``cuda``/``bf16_ok``/``tf32_ok`` default to what torch reports here; tests pass them to check
    the GPU configuration on a CPU machine.
    """
    if cuda is None:
        cuda = torch.cuda.is_available()
    if bf16_ok is None:
        bf16_ok = torch.cuda.is_bf16_supported() if cuda else _cpu_bf16()
    if tf32_ok is None:
        tf32_ok = cuda and torch.cuda.get_device_capability()[0] >= 8
    bf16 = (cuda and bf16_ok) if t.bf16 is None else bool(t.bf16)
    if bf16 and not bf16_ok:
        where = "this GPU" if cuda else "this CPU (it needs AVX-512 BF16 or AMX)"
        raise AblateError(f"trainer.bf16=true: {where} has no bfloat16 support")
    if t.length_grouping not in LENGTH_GROUPING:
        raise AblateError(
            f"trainer.length_grouping={t.length_grouping!r} is not one of "
            f"{', '.join(LENGTH_GROUPING)}"
        )
    kwargs: dict[str, Any] = {
        "train_sampling_strategy": "group_by_length" if t.length_grouping == "bucket" else "random",
        "optim": "adamw_torch_fused" if t.fused_adamw else "adamw_torch",
        "bf16": bf16,
        "dataloader_pin_memory": bool(cuda and t.pin_memory),
    }
    if cuda and t.tf32 and tf32_ok:
        kwargs["tf32"] = True
    return kwargs


def round_shapes(t: DictConfig, args) -> bool:
    """``trainer.round_shapes`` for TrainingArguments ``args``: null = on for bf16 on a CPU."""
    if t.round_shapes is not None:
        return bool(t.round_shapes)
    return _bf16_on_cpu(args)


def _bf16_on_cpu(args) -> bool:
    return bool(args.bf16) and args.device.type == "cpu"


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager:
    """Scaled-dot-product attention without cuDNN's kernel on CUDA: for bf16 with a mask torch
    picks it, and it built an execution plan on the CPU at every call (~11 ms on an H100, ~40x
    the kernel itself), so bf16 training on packed batches ran 5x slower than fp32. Flash and
    memory-efficient attention need no plan."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(kernels)


def _round_up(n: int, quantum: int | None) -> int:
    return n if not quantum else -(-n // quantum) * quantum


def _cpu_bf16() -> bool:
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX512", "AVX512_BF16", "AMX"):
        return False
    try:  # what torch itself checks before it allows CPU autocast to bf16
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


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


def _right_padded(inputs: Mapping) -> tuple[torch.Tensor | None, torch.Tensor | None]:
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
    mask, lengths = _right_padded(inputs)
    if mask is None:
        return None
    if quantum:
        inputs = _pad_width(inputs, _round_up(mask.size(1), quantum))
        mask = inputs["attention_mask"]
    rows, width = mask.shape
    order = torch.argsort(lengths, stable=True)
    ls = [_round_up(n, quantum) for n in lengths[order].tolist()]
    bounds, total = _partition(ls, cost)
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


def _partition(
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
    bounds, _ = _partition([lengths[i] for i in order], cost, max_rows)
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


def _task_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under ablate's and peft's wrappers."""
    from ablate import model as model_lib
    from ablate.prefix import PrefixCached

    return model_lib.unwrap(model.model if isinstance(model, PrefixCached) else model)


def packing_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``length_grouping=pack`` cannot pack ``model``'s training batches (None: it can)."""
    inner = _task_model(model)
    config = getattr(inner, "config", None)
    if not type(inner).__name__.endswith("ForTokenClassification"):
        return f"{type(inner).__name__} is not a per-token linear head"
    model_type = getattr(config, "model_type", None)
    if model_type not in PACKABLE_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(PACKABLE_MODEL_TYPES)}"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager", dropout.ATTENTION):
        return f"attention implementation {attention!r} (sdpa, eager or {dropout.ATTENTION} needed)"
    return None


def _first_fit_decreasing(lengths: list[int], width: int) -> list[list[int]]:
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


def _pack_cost(rows: int, width: int) -> float:
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
    bins = _first_fit_decreasing(lengths, longest)
    best = (_pack_cost(len(bins), longest), bins, longest)
    for rows in range(len(bins) - 1, 0, -1):  # fewer, wider rows
        width = max(longest, -(-total // rows))
        if _pack_cost(rows, width) >= best[0]:  # and fewer rows only get wider
            break
        bins = _first_fit_decreasing(lengths, width)
        while len(bins) > rows and _pack_cost(rows, width + 1) < best[0]:
            width += 1
            bins = _first_fit_decreasing(lengths, width)
        if len(bins) <= rows:
            best = (_pack_cost(len(bins), width), bins, width)
    return best[1], best[2]


def _rounded_layout(lengths: list[int], quantum: int) -> tuple[list[list[int]], int]:
    total, width = sum(lengths), _round_up(max(lengths), quantum)
    best: tuple[float, list[list[int]], int] | None = None
    # rows x W >= total, so width W costs at least total x (1 + W / PACK_ATTENTION_WIDTH)
    while best is None or total * (1 + width / PACK_ATTENTION_WIDTH) < best[0]:
        bins = _first_fit_decreasing(lengths, width)
        rows = _round_up(len(bins), max(1, SHAPE_TOKENS // width))
        if best is None or _pack_cost(rows, width) < best[0]:
            best = (_pack_cost(rows, width), bins + [[] for _ in range(rows - len(bins))], width)
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
    mask, lengths = _right_padded(inputs)
    if mask is None:
        return None
    rows, width = mask.shape
    ls = lengths.tolist()
    bins, packed_width = pack_layout(ls, quantum)
    if len(bins) * packed_width >= rows * width and not quantum:  # rounded: a shape seen before
        return None
    pad_slot = rows * width  # one extra slot holding each key's padding value
    shape = (len(bins), packed_width)
    source = torch.full(shape, pad_slot, dtype=torch.long)
    position = torch.zeros(shape, dtype=torch.long)
    window = torch.full(shape, -1, dtype=torch.long)  # padding: its own block
    for r, members in enumerate(bins):
        start = 0
        for i in members:
            n = ls[i]
            source[r, start : start + n] = torch.arange(i * width, i * width + n)
            position[r, start : start + n] = torch.arange(n)
            window[r, start : start + n] = i
            start += n
    source, position, window = (t.to(mask.device) for t in (source, position, window))
    packed: dict = {}
    for key, value in inputs.items():
        if key == "attention_mask":
            continue
        if torch.is_tensor(value) and value.dim() >= 2 and value.shape[:2] == (rows, width):
            flat = value.reshape(rows * width, *value.shape[2:])
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
    pays its per-sub-batch overhead in more tokens; blocks under a cached prefix do not run)."""
    from ablate import model as model_lib
    from ablate.prefix import PrefixCached

    try:
        blocks = model_lib.blocks(model)
    except AblateError:
        return SUB_BATCH_COST
    cached = isinstance(model, PrefixCached) and model.store is not None  # training on the cache
    running = blocks[model.k if cached else 0 :]
    if not len(running):
        return SUB_BATCH_COST
    params = sum(p.numel() for block in running for p in block.parameters()) / len(running)
    return max(1, round(SUB_BATCH_COST * SUB_BATCH_REFERENCE_PARAMS / max(params, 1)))


def _trainable_word_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    if get is None:
        return None
    try:
        words = get()
    except (AttributeError, NotImplementedError):
        return None
    weight = getattr(words, "weight", None)
    return words if weight is not None and weight.requires_grad else None


def _unsort(value, order: np.ndarray):
    """Rows of ``value`` (an array or a tuple of arrays) back from sorted to dataset order."""
    if isinstance(value, (tuple, list)):
        return type(value)(_unsort(v, order) for v in value)
    if isinstance(value, np.ndarray) and value.ndim and len(value) == len(order):
        out = np.empty_like(value)
        out[order] = value
        return out
    return value


def _prefix_hidden(model: torch.nn.Module, inputs: Mapping) -> Mapping:
    """For a prefix-cached model: the windows' cached hidden states in place of their index, so
    that they can be packed like any per-token input."""
    from ablate.prefix import PrefixCached

    if not isinstance(model, PrefixCached) or inputs.get("prefix_index") is None:
        return inputs
    out = {k: v for k, v in inputs.items() if k != "prefix_index"}
    out["prefix_hidden"] = model.training_prefix(inputs["prefix_index"], inputs["input_ids"])
    return out


class AblateTrainer(Trainer):
    """The Trainer with ``length_grouping`` (``pack``: ``pack_rows`` in ``compute_loss``;
    ``split``: sub-batches there; ``bucket``: ``LengthBucketSampler``) and evaluation that never
    shuffles and, with ``sorted_eval``, sorts by length.

    With ``train_sampling_strategy="group_by_length"`` the stock Trainer also shuffles dev/test into
    length groups; predictions must stay in dataset order (``predictions/dev.json`` pairs words
    across runs), so evaluation here is always sequential, or sorted and put back in order.
    """

    def __init__(
        self,
        *args,
        sorted_eval: bool = True,
        length_grouping: str = "pack",
        round_shapes: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.sorted_eval = sorted_eval
        # trainer.round_shapes: packed and split training batches in few shapes (SHAPE_WIDTH).
        # Evaluation keeps its widths: the same dev batches recur every epoch.
        self.quantum = SHAPE_WIDTH if round_shapes else None
        self._keep_evaluation = False
        self._losses: list[tuple[float, int]] = []
        self.last_evaluation: tuple[int, EvalLoopOutput] | None = None  # (global step, output)
        self.packing_unsupported = None
        if length_grouping == "pack":
            self.packing_unsupported = packing_unsupported(self.model)
            if self.packing_unsupported is not None:
                log.info("length_grouping=pack: %s; splitting batches instead",
                         self.packing_unsupported)  # fmt: skip
                length_grouping = "split"
        self.length_grouping = length_grouping
        self.sub_batch_cost = sub_batch_cost(self.model)  # split's parts, evaluation's batches
        self.stats = getattr(self.data_collator, "stats", None)
        if (self.split or self.pack) and self.stats is not None:
            self.stats.by_trainer = True  # count the rows computed, not the collated batch

    @property
    def rounding(self) -> str:
        """The ``speed.round_shapes`` tag."""
        if self.quantum is None:
            return "off"
        if not (self.pack or self.split):
            return f"not applied: length_grouping={self.length_grouping} (pack and split only)"
        if self.split:
            return f"training widths in multiples of {self.quantum} (split parts)"
        return (
            f"training widths in multiples of {self.quantum}; packed rows narrower than "
            f"{SHAPE_TOKENS} in groups of {SHAPE_TOKENS} tokens"
        )

    @property
    def eval_batch_cost(self) -> int:
        """What one more dev/test batch costs, in padded tokens (``length_batches``)."""
        return self.sub_batch_cost * (BF16_CPU_BATCH_COST if _bf16_on_cpu(self.args) else 1)

    @property
    def pack(self) -> bool:
        return self.length_grouping == "pack"

    @property
    def split(self) -> bool:
        return self.length_grouping == "split"

    def training_step(self, *args, **kwargs):
        with attention_kernels(self.args.device):
            return super().training_step(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.pack and model.training and not return_outputs:
            packed = pack_rows(
                _prefix_hidden(model, inputs),
                _task_model(model).config._attn_implementation,
                self.quantum,
            )
            if packed is not None:
                source = packed.pop("_source")
                if self.stats is not None:
                    self.stats.add({"attention_mask": source < inputs["attention_mask"].numel()})
                return super().compute_loss(model, packed, False, num_items_in_batch)
            if self.stats is not None:
                self.stats.add(inputs)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return self._split_loss(model, inputs, return_outputs, num_items_in_batch)

    def _split_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.get("labels")
        total = None if labels is None else (labels != IGNORE).sum()
        parts = None
        if self.split and model.training and not return_outputs and total:
            words = _trainable_word_embeddings(model)
            if words is not None and "input_ids" in inputs:
                # One lookup for the whole batch: each lookup's backward writes a dense gradient
                # of the whole vocabulary table (45 MB for MiniLM), which per part cost more
                # than the padding saved.
                ids = inputs["input_ids"]
                inputs = {k: v for k, v in inputs.items() if k != "input_ids"}
                inputs["inputs_embeds"] = words(ids)
            parts = split_by_length(inputs, self.sub_batch_cost, self.quantum)
        if parts is None:
            if self.stats is not None and self.stats.by_trainer and model.training:
                self.stats.add(inputs)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # Each part's mean loss weighted by its share of the batch's labelled tokens: the mean
        # over the whole batch, as one padded forward would give (padding never reaches a real
        # token: attention masks it).
        loss = 0.0
        for part in parts:
            if self.stats is not None:
                self.stats.add(part)
            n = (part["labels"] != IGNORE).sum()
            if n:
                part_items = n if num_items_in_batch is not None else None
                loss = loss + super().compute_loss(model, part, False, part_items) * (n / total)
        return loss

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy != "group_by_length" or not has_length(dataset):
            return super()._get_train_sampler(train_dataset)
        name = getattr(self.model, "main_input_name", "input_ids")
        lengths = [len(dataset[i][name]) for i in range(len(dataset))]
        return LengthBucketSampler(
            lengths, self.args.train_batch_size * self.args.gradient_accumulation_steps
        )

    def _get_eval_sampler(self, eval_dataset):
        return SequentialSampler(eval_dataset) if has_length(eval_dataset) else None

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        from ablate.prefix import PrefixCached

        if isinstance(self.model, PrefixCached) and self.args.should_save:
            # The Trainer saved the wrapped model's weights only (it is no PreTrainedModel); with
            # its config beside them the checkpoint loads with from_pretrained like any other.
            self.model.config.save_pretrained(output_dir or self.args.output_dir)

    def prediction_step(self, *args, **kwargs):
        # bf16: no_grad, as autocast keeps no bf16 weight copies under inference mode
        grad = torch.no_grad() if self.args.bf16 else torch.inference_mode()
        with grad, attention_kernels(self.args.device):
            loss, logits, labels = super().prediction_step(*args, **kwargs)
        if loss is not None and torch.is_tensor(labels):
            scored = int((labels != IGNORE).sum())
            self._losses.append((float(loss) * scored, scored))
        return loss, logits, labels

    def evaluate(self, eval_dataset=None, *args, **kwargs):
        # Only the training loop's dev evaluation (no dataset given) is kept for predictions().
        self._keep_evaluation = eval_dataset is None
        try:
            return super().evaluate(eval_dataset, *args, **kwargs)
        finally:
            self._keep_evaluation = False

    def predictions(self, dataset) -> tuple[Any, Any]:
        """(predictions, label_ids) of ``dataset`` by the current model: the training loop's last
        dev evaluation when ``dataset`` is the dev set and the weights have not changed since
        (no step taken, no best checkpoint loaded), else a new ``predict``."""
        kept = self.last_evaluation
        if (
            kept is not None
            and dataset is self.eval_dataset
            and kept[0] == self.state.global_step
            and not self.args.load_best_model_at_end
        ):
            return kept[1].predictions, kept[1].label_ids
        out = self.predict(dataset)
        return out.predictions, out.label_ids

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
        metric_key_prefix="eval",
    ) -> EvalLoopOutput:  # fmt: skip
        self._losses = []  # (loss x scored labels, scored labels) per batch
        with self._weights_cast_once():
            out = self._evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        # The Trainer averages batch means, each weighted as eval_batch_size examples; batches
        # cut by length differ in size, so the loss is the mean over scored labels instead.
        key, scored = f"{metric_key_prefix}_loss", sum(n for _, n in self._losses)
        if key in out.metrics and scored:
            out.metrics[key] = sum(total for total, _ in self._losses) / scored
        if self._keep_evaluation:
            self.last_evaluation = (self.state.global_step, out)
        return out

    def _weights_cast_once(self) -> contextlib.AbstractContextManager:
        # Under bf16 each forward enters autocast, and leaving it drops the bf16 copies of the
        # weights: every eval batch cast every weight again (casts were a quarter of bf16
        # evaluation on CPU). An enclosing autocast keeps those copies for the whole loop; no
        # step changes the weights during it, and every op casts as before.
        if not self.args.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.args.device.type, dtype=torch.bfloat16)

    def _evaluation_loop(self, dataloader, description, *args, **kwargs) -> EvalLoopOutput:
        dataset = getattr(dataloader, "dataset", None)
        name = getattr(self.model, "main_input_name", "input_ids")
        if (
            not self.sorted_eval
            or not has_length(dataset)
            or len(dataset) == 0
            or self.args.world_size > 1
            or self.args.batch_eval_metrics
            or not isinstance(dataset[0], Mapping)
            or name not in dataset[0]
        ):
            return super().evaluation_loop(dataloader, description, *args, **kwargs)
        batches = length_batches(
            [len(dataset[i][name]) for i in range(len(dataset))],
            self.args.eval_batch_size,
            self.eval_batch_cost,
        )
        order = np.concatenate(batches)
        # The Trainer's loaders take one batch size; a DataLoader takes batches of any size.
        loader = self.accelerator.prepare(
            DataLoader(
                dataset,
                batch_sampler=batches,
                collate_fn=self._get_collator_with_removed_columns(self.data_collator, description),
                num_workers=self.args.dataloader_num_workers,
                pin_memory=self.args.dataloader_pin_memory,
            )
        )
        out = super().evaluation_loop(loader, description, *args, **kwargs)
        return out._replace(
            predictions=_unsort(out.predictions, order), label_ids=_unsort(out.label_ids, order)
        )


@dataclass
class BatchStats:
    """Token counts of the training batches computed while ``active``."""

    active: bool = False
    by_trainer: bool = False  # AblateTrainer counts the sub-batches it computes, not the collator
    real: int = 0  # non-pad tokens
    padded: int = 0  # batch x padded length
    sum_bl2: int = 0  # batch x padded length^2 (attention's share of the FLOPs)
    shapes: list[tuple[int, int]] = field(default_factory=list)

    def reset(self) -> None:
        self.real = self.padded = self.sum_bl2 = 0
        self.shapes = []

    def add(self, batch: Mapping) -> None:
        """Count one computed batch (its ``attention_mask``, else its ``input_ids``)."""
        mask = batch.get("attention_mask")
        shaped = mask if mask is not None else batch.get("input_ids")
        if not self.active or shaped is None or shaped.dim() < 2:
            return
        b, length = shaped.shape[:2]
        self.real += int(mask.sum()) if mask is not None else b * length
        self.padded += b * length
        self.sum_bl2 += b * length * length
        self.shapes.append((b, length))


class CountingCollator:
    """Wraps a collator: stacks ``PASSTHROUGH`` keys and counts tokens of training batches."""

    def __init__(self, inner: Callable):
        self.inner = inner
        self.stats = BatchStats()

    def __call__(self, features: list[dict]) -> dict:
        extra = {k: [f[k] for f in features] for k in PASSTHROUGH if k in features[0]}
        if extra:
            features = [{k: v for k, v in f.items() if k not in extra} for f in features]
        batch = self.inner(features)
        for k, values in extra.items():
            batch[k] = torch.tensor(values)
        if not self.stats.by_trainer:
            self.stats.add(batch)
        return batch


def train_step_flops(model: torch.nn.Module, batch: dict) -> int:
    """FLOPs of one forward + backward on ``batch`` (torch's FlopCounterMode); grads are cleared.

    CPU attention kernels are not counted by torch 2.13's counter: at these lengths that is under
    1 % of a BERT block's FLOPs.
    """
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.train()
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(**batch)
        loss = out["loss"] if isinstance(out, Mapping) else out[0]
        loss.backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return counter.get_total_flops()


def _crop(feature: dict, length: int) -> dict:
    return {k: v[:length] if isinstance(v, (list, tuple)) else v for k, v in feature.items()}


def flop_model(
    model: torch.nn.Module, dataset: Sequence[dict], collate: Callable, device
) -> tuple[float, float]:
    """(a, b) with FLOPs of a training step on a (B, L) batch = B x (a x L + b x L^2).

    Two probes of the longest examples cropped to two lengths; attention makes the L^2 term.
    """
    longest = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["input_ids"]))[-4:]
    top = min(len(dataset[i]["input_ids"]) for i in longest)
    lengths = (max(2, top // 2), top) if top >= 4 else (top, top)
    per_example = []
    for length in lengths:
        batch = collate([_crop(dataset[i], length) for i in longest])
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        per_example.append(train_step_flops(model, batch) / len(longest))
    (l1, l2), (f1, f2) = lengths, per_example
    if l1 == l2:
        return f2 / l2, 0.0
    b = max(0.0, (f2 / l2 - f1 / l1) / (l2 - l1))
    return f1 / l1 - b * l1, b


class SpeedMeter(TrainerCallback):
    """Logs per epoch (step = epoch): ``train_tokens`` (non-pad), ``train_tokens_per_s``,
    ``padding_pct`` and ``dev_eval_time_s``; with ``measure_flops`` at the end also
    ``train_flops_per_epoch`` and ``train_flops_per_s`` (executed FLOPs, padding included).
    """

    def __init__(self, run, collator: CountingCollator, measure_flops: bool = False):
        self.run = run
        self.collator = collator
        self.measure_flops = measure_flops
        self.epoch_stats: list[tuple[int, int, int, float]] = []  # real, padded, sum_bl2, seconds
        self._t0 = 0.0

    @staticmethod
    def _epoch(state) -> int:
        return int(round(state.epoch or 0))

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.collator.stats.reset()
        self.collator.stats.active = True
        self._t0 = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self._t0
        s = self.collator.stats
        s.active = False
        self.epoch_stats.append((s.real, s.padded, s.sum_bl2, seconds))
        metrics = {"train_tokens": s.real, "train_tokens_per_s": s.real / max(seconds, 1e-9)}
        if s.padded:
            metrics["padding_pct"] = 100.0 * (s.padded - s.real) / s.padded
        self.run.metrics(metrics, step=self._epoch(state))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_runtime" in metrics:
            self.run.metrics({"dev_eval_time_s": metrics["eval_runtime"]}, step=self._epoch(state))

    def on_train_end(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if not (self.measure_flops and self.epoch_stats and model is not None):
            return
        dataset = getattr(train_dataloader, "dataset", None)
        if dataset is None or not len(dataset):
            return
        a, b = flop_model(model, dataset, self.collator, args.device)  # stats inactive now
        flops = [a * padded + b * bl2 for _, padded, bl2, _ in self.epoch_stats]
        seconds = sum(s for *_, s in self.epoch_stats)
        self.run.metrics(
            {
                "train_flops_per_epoch": sum(flops) / len(flops),
                "train_flops_per_s": sum(flops) / max(seconds, 1e-9),
            }
        )
