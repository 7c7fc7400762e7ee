"""Per-epoch records of a run: its dev metrics, training loss and epoch time (step = epoch)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from transformers import TrainerCallback

from ablate.training.recorder import Recorder
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
