"""The plugin of ``trainer.cache_frozen`` and ``trainer.cache_frozen_eval`` (the mechanism is
``ablate.speed.prefix``): it wraps the model in ``PrefixCached``, gives the training and dev
windows their index into the caches, stacks those indices into batches and writes the wrapped
model's config into each checkpoint."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from ablate.errors import AblateError
from ablate.plugins import Context, Plugin, off_or
from ablate.speed.prefix import PrefixCached, PrefixStore, check, compute, frozen_prefix

log = logging.getLogger(__name__)

INDEX_KEYS = ("prefix_index", "eval_index")  # per-window scalars, stacked rather than padded


class StackIndices:
    """Wraps a collator: the windows' cache indices are stacked, the rest collated as before."""

    def __init__(self, inner: Callable):
        self.inner = inner

    def __call__(self, features: list[dict]) -> dict:
        extra = {k: [f[k] for f in features] for k in INDEX_KEYS if k in features[0]}
        if extra:
            features = [{k: v for k, v in f.items() if k not in extra} for f in features]
        batch = self.inner(features)
        for k, values in extra.items():
            batch[k] = torch.tensor(values)
        return batch


class SaveConfig(TrainerCallback):
    """After each checkpoint: the wrapped model's config beside its weights. The Trainer saves a
    PrefixCached model's state dict only (it is no PreTrainedModel); with the config the
    checkpoint loads with ``from_pretrained`` like any other."""

    def __init__(self, model: PrefixCached):
        self.model = model

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            self.model.config.save_pretrained(f"{args.output_dir}/checkpoint-{state.global_step}")


def _prefix_name(k: int) -> str:
    return f"embeddings + blocks 0-{k - 1}"


def _train_store(ctx: Context, model, k: int, why, train, pad_id: int):
    if status := off_or(ctx, "trainer.cache_frozen", why or (None if train else "no windows")):
        if status != "off":
            log.warning("trainer.cache_frozen: %s; training the usual way", status)
        return None, status
    t0 = time.perf_counter()
    store = compute(model, k, train, ctx.cfg.trainer.eval_batch_size, pad_id)
    seconds = time.perf_counter() - t0
    diff = check(PrefixCached(model, k, store), train, pad_id)
    if not diff <= 1e-3:  # also catches NaN
        raise AblateError(
            f"trainer.cache_frozen: the cached forward of {type(model).__name__} differs from the "
            f"full one by {diff:.3g}; this architecture is not supported, set "
            f"trainer.cache_frozen=false"
        )
    ctx.record.metrics({"cache_frozen_time_s": seconds, "cache_frozen_mb": store.nbytes / 2**20})
    log.info(
        "cache_frozen: %s computed once for %d windows in %.1f s (%.0f MiB)",
        _prefix_name(k),
        len(train),
        seconds,
        store.nbytes / 2**20,
    )
    return store, _prefix_name(k)


def _eval_store(ctx: Context, model, k: int, why, dev, pad_id: int):
    if status := off_or(ctx, "trainer.cache_frozen_eval", why or (None if dev else "no dev")):
        return None, status
    device = next(model.parameters()).device
    lengths = [len(f["input_ids"]) for f in dev]
    store = PrefixStore.empty(lengths, model.config.hidden_size, device)
    try:
        diff = check(PrefixCached(model, k, None, store), dev, pad_id, index_key="eval_index")
    except Exception as exc:  # on by default: no encoder may fail a run through it
        diff, failed = float("nan"), f"{type(exc).__name__}: {exc}"
    else:
        failed = None
    store.filled.zero_()  # the first evaluation computes every window, in its own precision (bf16)
    if not diff <= 1e-3:  # an encoder the cached forward does not fit evaluates the usual way
        reason = failed or f"the cached forward of {type(model).__name__} differs by {diff:.3g}"
        log.warning("trainer.cache_frozen_eval: not applied (%s)", reason)
        return None, f"not applied: {reason}"
    return store, f"dev windows: {_prefix_name(k)}, kept from the first evaluation"


class CacheFrozen(Plugin):
    name = "cache_frozen"
    switches = ("trainer.cache_frozen", "trainer.cache_frozen_eval")
    provides = ("model.per_token_inputs", "model.first_trained_block")  # PrefixCached's

    def prepare(self, ctx: Context) -> dict[str, str]:
        model = ctx.model
        k, why = frozen_prefix(ctx.applied)
        pad_id = ctx.tokenizer.pad_token_id if ctx.tokenizer.pad_token_id is not None else 0
        train, dev = ctx.features["train"], ctx.features.get("dev") or []
        store, train_status = _train_store(ctx, model, k, why, train, pad_id)
        eval_store, eval_status = _eval_store(ctx, model, k, why, dev, pad_id)
        status = {"cache_frozen": train_status, "cache_frozen_eval": eval_status}
        if store is None and eval_store is None:
            return status
        if store is not None:
            ctx.features["train"] = [{**f, "prefix_index": i} for i, f in enumerate(train)]
        if eval_store is not None:
            ctx.features["dev"] = [{**f, "eval_index": i} for i, f in enumerate(dev)]
        ctx.model = PrefixCached(model, k, store, eval_store)
        ctx.collator = StackIndices(ctx.collator)
        ctx.callbacks.append(SaveConfig(ctx.model))
        return status
