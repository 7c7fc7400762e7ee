"""``trainer.length_grouping`` and ``trainer.round_shapes``: how training batches are laid out.

``pack`` (default) keeps the plain recipe's random batches but packs each batch's windows side by
side into fewer rows (``batching.pack_rows``): block-diagonal attention and positions restarting
per window give every token the logits it has alone, so the loss and gradient are the batch's,
with ~3 % padding instead of ~60 %. Models it cannot pack (sentence heads, the BiLSTM head,
relative positions) fall back to ``split``: each batch computed as sub-batches of similar length
(``batching.split_by_length``), the same gradient at a per-sub-batch overhead. ``bucket`` forms
the batches themselves from windows of similar length (``batching.LengthBucketSampler``): other
batches, which cost accuracy early in training. ``off``: padded random batches.
``round_shapes`` (null = on for bf16 on a CPU and with ``trainer.compile``) keeps packed and split
batches in few shapes, as oneDNN builds its bf16 kernels per shape and ``torch.compile`` compiles
per shape (``batching.SHAPE_WIDTH``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers.trainer_utils import has_length

from ablate.data.encode import IGNORE
from ablate.models import anatomy
from ablate.plugins import Context, Plugin
from ablate.speed import batching
from ablate.speed.dropout import ATTENTION
from ablate.speed.precision import bf16_on_cpu

log = logging.getLogger(__name__)

# Encoders whose embeddings take absolute ``position_ids`` counted from 0 and whose attention
# takes a 4-D mask as given: a packed row then computes each window exactly as alone.
PACKABLE_MODEL_TYPES = ("bert", "distilbert")


def packing_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``length_grouping=pack`` cannot pack ``model``'s training batches (None: it can)."""
    inner = anatomy.unwrap(model)
    config = getattr(inner, "config", None)
    if not type(inner).__name__.endswith("ForTokenClassification"):
        return f"{type(inner).__name__} is not a per-token linear head"
    model_type = getattr(config, "model_type", None)
    if model_type not in PACKABLE_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(PACKABLE_MODEL_TYPES)}"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager", ATTENTION):
        return f"attention implementation {attention!r} (sdpa, eager or {ATTENTION} needed)"
    return None


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


def _per_token(model: torch.nn.Module, inputs: dict) -> dict:
    # A wrapper whose batches carry per-window keys (the frozen-prefix cache's index) turns them
    # into per-token inputs that can be packed like input_ids.
    expand = getattr(model, "per_token_inputs", None)
    return expand(inputs) if expand is not None else inputs


class GroupingMixin:
    """Trainer mixin: ``pack`` and ``split`` in ``compute_loss``, ``bucket`` in the sampler.

    Set by ``LengthGrouping.attach``: ``length_grouping``, ``quantum`` (``round_shapes``),
    ``sub_batch_cost`` and ``stats`` (the meter's token counts of the rows computed).
    """

    length_grouping = "off"
    quantum: int | None = None
    sub_batch_cost = batching.SUB_BATCH_COST
    stats = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.length_grouping == "pack" and model.training and not return_outputs:
            attention = anatomy.unwrap(model).config._attn_implementation
            packed = batching.pack_rows(_per_token(model, inputs), attention, self.quantum)
            if packed is not None:
                source = packed.pop("_source")
                if self.stats is not None:
                    self.stats.add({"attention_mask": source < inputs["attention_mask"].numel()})
                return super().compute_loss(model, packed, False, num_items_in_batch)
            if self.stats is not None:
                self.stats.add(inputs)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.length_grouping == "split":
            return self._split_loss(model, inputs, return_outputs, num_items_in_batch)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _split_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.get("labels")
        total = None if labels is None else (labels != IGNORE).sum()
        parts = None
        if model.training and not return_outputs and total:
            words = _trainable_word_embeddings(model)
            if words is not None and "input_ids" in inputs:
                # One lookup for the whole batch: each lookup's backward writes a dense gradient
                # of the whole vocabulary table (45 MB for MiniLM), which per part cost more
                # than the padding saved.
                ids = inputs["input_ids"]
                inputs = {k: v for k, v in inputs.items() if k != "input_ids"}
                inputs["inputs_embeds"] = words(ids)
            parts = batching.split_by_length(inputs, self.sub_batch_cost, self.quantum)
        if parts is None:
            if self.stats is not None and model.training:
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
        if self.length_grouping != "bucket" or not has_length(dataset):
            return super()._get_train_sampler(train_dataset)
        name = getattr(self.model, "main_input_name", "input_ids")
        lengths = [len(dataset[i][name]) for i in range(len(dataset))]
        return batching.LengthBucketSampler(
            lengths, self.args.train_batch_size * self.args.gradient_accumulation_steps
        )


class LengthGrouping(Plugin):
    name = "length_grouping"
    switches = ("trainer.length_grouping", "trainer.round_shapes")
    uses = ("model.per_token_inputs", "model.first_trained_block", "collator.stats")

    def arguments(self, ctx: Context) -> dict[str, Any]:
        # The stock Trainer also sorts dev/test into length groups under group_by_length; the
        # core Trainer's evaluation stays sequential whatever this says.
        bucket = ctx.value("trainer.length_grouping") == "bucket"
        return {"train_sampling_strategy": "group_by_length" if bucket else "random"}

    def prepare(self, ctx: Context) -> dict[str, str]:
        grouping = ctx.value("trainer.length_grouping")
        status = grouping
        if grouping == "pack" and (why := packing_unsupported(ctx.model)) is not None:
            log.info("length_grouping=pack: %s; splitting batches instead", why)
            grouping, status = "split", f"split (pack: {why})"
        self.grouping = grouping
        rounding = ctx.value("trainer.round_shapes")
        if isinstance(rounding, str):  # null: on where each new shape costs a build or a compile
            # (torch.compile past its recompile limit runs the model eagerly: shapes kept few)
            compiled = bool(ctx.args.torch_compile)  # the strategy's eager fallback counted
            rounding = compiled or (rounding.startswith("with bf16") and bf16_on_cpu(ctx.args))
        self.quantum = batching.SHAPE_WIDTH if rounding else None
        if grouping != "off":
            ctx.mixins.append(GroupingMixin)
        return {"length_grouping": status, "round_shapes": self._rounding(grouping)}

    def _rounding(self, grouping: str) -> str:
        if self.quantum is None:
            return "off"
        if grouping not in ("pack", "split"):
            return f"not applied: length_grouping={grouping} (pack and split only)"
        if grouping == "split":
            return f"training widths in multiples of {self.quantum} (split parts)"
        return (
            f"training widths in multiples of {self.quantum}; packed rows narrower than "
            f"{batching.SHAPE_TOKENS} in groups of {batching.SHAPE_TOKENS} tokens"
        )

    def attach(self, ctx: Context, trainer) -> dict[str, str]:
        if self.grouping == "off":
            return {}
        trainer.length_grouping = self.grouping
        trainer.quantum = self.quantum if self.grouping in ("pack", "split") else None
        trainer.sub_batch_cost = batching.sub_batch_cost(trainer.model)
        stats = getattr(trainer.data_collator, "stats", None)
        if stats is not None and self.grouping in ("pack", "split"):
            trainer.stats = stats
            stats.by_trainer = True  # count the rows computed, not the collated batch
        return {}
