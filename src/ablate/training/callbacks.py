"""Per-epoch records of a run: its dev metrics, training loss and epoch time (step = epoch)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence

from transformers import TrainerCallback

from ablate.tracking.recorder import Recorder
from ablate.training import DIVERGED_TAG
from ablate.training.resources import cpu_gflops, usable_cpus

log = logging.getLogger("ablate")


def epoch_of(state) -> int:
    """The Trainer's epoch count as an integer step (1..N once an epoch has ended)."""
    return int(round(state.epoch or 0))


class EpochLogger(TrainerCallback):
    """Records per-epoch metrics with step = epoch (1..N), writes one line per epoch to the job
    log (epoch, dev metric, train loss, time), and beats the run's heartbeat.

    ``load_per_cpu`` (the machine's 1-minute load average per usable CPU, at each epoch's end)
    tells the report whether a run's times were measured beside other work, and ``cpu_gflops``
    (``resources.cpu_gflops``, after each epoch of a CPU run long enough that its ~50 ms count
    for little) how fast the CPU ran.

    The Trainer's own MLflow integration steps metrics by optimiser step and logs every
    TrainingArguments field as a param, which would clash with ours; this keeps one scheme.
    """

    HEARTBEAT_S = 60.0
    PROBE_FROM_S = 5.0  # epochs at least this long are followed by the CPU speed probe

    def __init__(self, record: Recorder, primary: str = "accuracy", also: Sequence[str] = ()):
        self.record = record
        self.primary = primary
        self.also = tuple(also)  # other dev metrics logged per epoch
        self._t0 = 0.0
        self._beat = time.monotonic()
        self._seconds = 0.0
        self._loss: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self._beat > self.HEARTBEAT_S:
            self._beat = time.monotonic()
            self.record.heartbeat()

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        self._seconds = time.perf_counter() - self._t0
        load = os.getloadavg()[0] / usable_cpus() if hasattr(os, "getloadavg") else None
        epoch = {"epoch_time_s": self._seconds}
        if load is not None:
            epoch["load_per_cpu"] = load
        if args.device.type == "cpu" and self._seconds >= self.PROBE_FROM_S:
            epoch["cpu_gflops"] = cpu_gflops()
        self.record.metrics(epoch, step=epoch_of(state))
        self.record.heartbeat()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self._loss = logs["loss"]
            self.record.metrics({"train_loss": logs["loss"]}, step=epoch_of(state))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        value = metrics[f"eval_{self.primary}"]
        logged = {f"dev_{self.primary}": value}
        logged.update(
            {f"dev_{k}": metrics[f"eval_{k}"] for k in self.also if f"eval_{k}" in metrics}
        )
        self.record.metrics(logged, step=epoch_of(state))
        loss = "" if self._loss is None else f", train loss {self._loss:.4f}"
        epochs = round(args.num_train_epochs)
        log.info(
            "epoch %d/%d: dev %s %.4f%s, %.1f s training",
            epoch_of(state),
            epochs,
            self.primary,
            value,
            loss,
            self._seconds,
        )


class StopDiverged(TrainerCallback):
    """Stops a run whose training diverged, at the end of the epoch it shows: that epoch is
    neither evaluated nor saved, the run is tagged ``ablate.diverged=epoch N`` and ``verdict``
    says why (``fit`` then fails the run with it, before its test evaluation).

    The rule, read where the Trainer logs the epoch's mean training loss (once an epoch: no host
    read per step): that loss is not finite, or more than ``FACTOR`` times the run's start. The
    start is the lower of the first epoch's loss and ln K, the cross-entropy of a head guessing
    uniformly among the task's K labels, which is about where an untrained head starts: a run
    that blew up in its first epoch is caught then, one that trained and blew up later when its
    loss rose tenfold. A dev loss that is not finite counts too (weights gone NaN: the Trainer's
    logged loss leaves out the steps whose loss was not finite).
    """

    FACTOR = 10.0

    def __init__(self, record: Recorder, labels: int):
        self.record = record
        self.chance = math.log(labels) if labels > 1 else math.inf
        self.verdict: str | None = None  # why the run stopped, once it diverged

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or self.verdict:
            return
        loss = logs["loss"]
        first = next(e["loss"] for e in state.log_history if "loss" in e)  # a resumed run's too
        start = min(first, self.chance)
        if not math.isfinite(loss):
            why = f"training loss {loss}"
        elif loss > self.FACTOR * start:
            why = f"training loss {loss:.4g}, over {self.FACTOR:g}x its start {start:.3g}"
        else:
            return
        self._stop(args, state, control, why)
        control.should_evaluate = False  # the epoch's scores and checkpoint are worth nothing

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = (metrics or {}).get("eval_loss")
        if not self.verdict and loss is not None and not math.isfinite(loss):
            self._stop(args, state, control, f"dev loss {loss}")

    def _stop(self, args, state, control, why: str) -> None:
        epoch = epoch_of(state)
        self.record.tags({DIVERGED_TAG: f"epoch {epoch}"})
        self.verdict = (
            f"training diverged in epoch {epoch} at trainer.lr={args.learning_rate:g} ({why}): "
            "stopped, its run FAILED; try a lower trainer.lr"
        )
        control.should_training_stop = True
        control.should_save = False


class SendEvaluated(TrainerCallback):
    """Sends what an epoch's evaluation recorded, every callback's (so the Trainer's last
    callback), before the epoch's checkpoint is saved: a run killed after that checkpoint shows
    in the store every epoch it resumes after."""

    def __init__(self, record: Recorder):
        self.record = record

    def on_evaluate(self, args, state, control, **kwargs):
        self.record.heartbeat()


def dev_history(state, primary: str) -> list[float]:
    """The primary dev metric after each epoch the model holds: the Trainer's log history (a
    resumed run's includes the epochs of its checkpoint, and not an epoch scored after it)."""
    key = f"eval_{primary}"
    return [entry[key] for entry in state.log_history if key in entry]
