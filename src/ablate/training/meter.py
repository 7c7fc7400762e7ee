"""Measurement: real and padded training tokens, their rate, the padding share, the dev evaluation
time per epoch, and the run's executed training FLOPs (``train_flops``; with
``trainer.measure_flops`` also per epoch and per second).

Always on, part of every run's training: it changes nothing a run computes. ``CountingCollator``
counts the collated training batches, or, where a Trainer mixin computes other rows than it
collated (packed rows, sub-batches), that mixin counts what it computes (``BatchStats.by_trainer``;
the collator's ``stats`` is what ``ablate.plugins.CORE_PROVIDES`` names).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState


@dataclass
class BatchStats:
    """Token counts of the training batches computed while ``active``."""

    active: bool = False
    by_trainer: bool = False  # a Trainer mixin counts the rows it computes, not the collator
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
    """Wraps a collator: counts the tokens of the training batches it collates."""

    def __init__(self, inner: Callable):
        self.inner = inner
        self.stats = BatchStats()

    def __call__(self, features: list[dict]) -> dict:
        batch = self.inner(features)
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


class SpeedMeter(TrainerCallback, ExportableState):
    """Logs per epoch (step = epoch): ``train_tokens`` (non-pad), ``train_tokens_per_s``,
    ``padding_pct`` and ``dev_eval_time_s``; at the end ``train_flops`` (executed FLOPs of the
    run, padding included: two probes of a forward and backward, ``flop_model``), and with
    ``measure_flops`` also ``train_flops_per_epoch`` and ``train_flops_per_s``.

    Each epoch checkpoint keeps the epochs measured so far and the training time spent
    (``state``), so a resumed run's totals are the whole run's: ``earlier_s`` and ``samples``
    give ``fit`` its ``train_runtime_s`` and ``train_samples_per_s``, and a run resumed after
    its last epoch, which trains nothing itself, keeps its FLOPs.
    """

    def __init__(self, run, collator: CountingCollator, measure_flops: bool = False):
        self.run = run
        self.collator = collator
        self.measure_flops = measure_flops
        self.epoch_stats: list[tuple[int, int, int, float]] = []  # real, padded, sum_bl2, seconds
        self.earlier_s = 0.0  # training time of the processes before this one (a resumed run)
        self.samples = 0.0  # training samples of the whole run, as the Trainer counts them
        self._t0 = 0.0
        self._began: float | None = None  # when this process's training began

    @staticmethod
    def _epoch(state) -> int:
        return int(round(state.epoch or 0))

    def state(self) -> dict:
        """What an epoch checkpoint keeps of the meter (its ``trainer_state.json``); read back by
        the meter itself as a resumed run begins, never by the Trainer, which would build a new
        meter from it (``restore_callback_states_from_checkpoint`` stays off)."""
        spent = 0.0 if self._began is None else time.perf_counter() - self._began
        stats = [list(s) for s in self.epoch_stats]
        return {
            "args": {},
            "attributes": {"epoch_stats": stats, "runtime_s": self.earlier_s + spent},
        }

    def on_train_begin(self, args, state, control, **kwargs):
        name = type(self).__name__
        kept = (state.stateful_callbacks or {}).get(name) or {}  # a resumed run's checkpoint's
        kept = kept.get("attributes", {}) if isinstance(kept, dict) else {}
        self.epoch_stats = [tuple(s) for s in kept.get("epoch_stats", [])]
        self.earlier_s = float(kept.get("runtime_s", 0.0))
        # a checkpoint written before the meter kept its state has no entry to update
        state.stateful_callbacks.setdefault(name, self.state())
        self._began = time.perf_counter()

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
        dataset = getattr(train_dataloader, "dataset", None)
        if dataset is None or not len(dataset):
            return
        # the Trainer's count (its train_samples_per_second's), over every step of the run
        steps = state.global_step / max(state.max_steps, 1)
        self.samples = len(dataset) * args.num_train_epochs * steps
        if not self.epoch_stats or model is None:
            return
        a, b = flop_model(model, dataset, self.collator, args.device)  # stats inactive now
        flops = [a * padded + b * bl2 for _, padded, bl2, _ in self.epoch_stats]
        # executed training FLOPs of the whole run, a resumed run's earlier epochs included
        metrics = {"train_flops": sum(flops)}
        if self.measure_flops:
            seconds = sum(s for *_, s in self.epoch_stats)
            metrics.update(
                train_flops_per_epoch=sum(flops) / len(flops),
                train_flops_per_s=sum(flops) / max(seconds, 1e-9),
            )
        self.run.metrics(metrics)
