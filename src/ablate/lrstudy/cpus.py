"""A trial's share of its machine's CPUs: without ``trainer.threads``, each trial of a study
trains with the usable CPUs divided among the study's trials running on this host, counted again
as they start and end; so two workers started side by side take half each, and the last trial
left running takes them all rather than leaving a core idle."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch
from transformers import TrainerCallback

from ablate.lrstudy import owner_here
from ablate.tracking import procs
from ablate.tracking.recorder import Recorder
from ablate.training.resources import usable_cpus

if TYPE_CHECKING:
    import optuna

log = logging.getLogger("ablate")

RECOUNT_S = 30.0  # how often a trial counts its neighbours again: a sqlite read, a step's ms


def running_here(study: optuna.Study) -> int:
    """The study's trials training on this host now (each worker records its trial's process:
    host, pid, start), at least 1: this trial, before its worker's record is read back."""
    from optuna.trial import TrialState  # here: a run outside a study loads no Optuna

    count = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if owner := owner_here(t):
            count += procs.same(int(owner["pid"]), owner.get("started"))
    return max(1, count)


class ShareCpus(TrainerCallback):
    """Sets this trial's torch threads to its share of the CPUs at the start and every
    ``RECOUNT_S`` of training (between steps: torch takes a new thread count at any time), each
    change a ``torch_threads`` metric of the run at its step."""

    def __init__(self, study: optuna.Study, number: int, record: Recorder):
        self.study, self.number, self.record, self.counted = study, number, record, 0.0

    def share(self, step: int) -> int:
        """Count the study's trials on this host and take this trial's share; the threads."""
        self.counted = time.monotonic()
        cpus = usable_cpus()
        try:
            threads = max(1, cpus // running_here(self.study))
        except Exception as e:  # a share is an optimisation: a storage that fails keeps the threads
            log.warning("lr study: trial %d keeps its threads: %s", self.number, e)
            return torch.get_num_threads()
        if threads != torch.get_num_threads():
            self.record.metrics({"torch_threads": threads}, step=step)
            log.info(
                "lr study: trial %d trains with %d torch thread(s): %d usable CPUs among the "
                "study's trials running on this host",
                self.number,
                threads,
                cpus,
            )
            torch.set_num_threads(threads)
        return threads

    def on_train_begin(self, args, state, control, **kwargs):
        self.share(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self.counted >= RECOUNT_S:
            self.share(state.global_step)
