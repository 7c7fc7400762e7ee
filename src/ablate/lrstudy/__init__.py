"""Learning-rate studies on Optuna, driven by ablate: ``study`` runs one freeze option's study
(persistent, resumable, shared by several workers, pruned, widening its range) in the Optuna
storage ``storage`` opens; ``pruning`` is the per-epoch hook a trial's training reports through.
``python -m ablate.lrstudy`` runs them; ``ablate.lrstudy.runs`` reads their trials back from
MLflow."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterable, Mapping

from ablate import plugins
from ablate.config import LrStudyConfig
from ablate.training import DIVERGED_TAG

TRIAL_ENV = "ABLATE_LR_TRIAL"  # a trial's process: JSON of storage, study, trial_id, driver pid
TRIAL_TAG = "lr_trial"  # MLflow tag of a trial's run: "<optuna study>:<trial number>"
PRUNED_TAG = "ablate.pruned"  # "true" on a pruned trial's run (ended KILLED, not a candidate)
PRUNED_EPOCH_TAG = "ablate.pruned_epoch"  # the last epoch it trained
# the [low, high] lr range (JSON) the trial's lr was drawn from: the study's, widened or not
RANGE_TAG = "ablate.lr_range"
# a run trained at its study's pick where that lies in the searched range's outer tenths (log
# scale): "<where> of [low, high]"; absent where the pick is interior
EDGE_TAG = "lr_study.edge"
# a trial that trains a pruned neighbour of its study's best again, unpruned: the Optuna user
# attribute and the MLflow tag of its run, both the pruned trial's number
CHECK = "checks"
CHECK_TAG = "ablate.lr_checks"

# a trial's training reports to its study through a training plugin, registered by name: the
# study's own process, which imports this package, loads no torch or transformers
plugins.register("ablate.lrstudy.pruning:LrTrial")


def pruned(tags: Mapping[str, str]) -> bool:
    """Whether a run's tags mark a pruned trial: no candidate, whatever its status says."""
    return tags.get(PRUNED_TAG) == "true"


def diverged_epoch(tags: Mapping[str, str]) -> int | None:
    """The epoch in which a run's training diverged (``ablate.training.DIVERGED_TAG``: it ended
    FAILED there, no candidate), or None."""
    tag = tags.get(DIVERGED_TAG)
    return int(tag.split()[-1]) if tag else None


def run_ended(status: str, tags: Mapping[str, str]) -> bool:
    """Whether a trial's run ended: it trained out (FINISHED), its study pruned it, or its
    training diverged (FAILED: the study prunes it too)."""
    return status == "FINISHED" or pruned(tags) or diverged_epoch(tags) is not None


def owner_here(trial) -> dict | None:
    """The process a RUNNING Optuna ``trial`` records as its worker (host, pid, start), where
    that worker ran on this host; None for another host's, or a retry that still carries its
    earlier try's record."""
    owner = trial.user_attrs.get("process", {})
    if owner.get("trial") != trial.number or owner.get("host") != socket.gethostname():
        return None
    return owner


def trained_out(status: str, tags: Mapping[str, str]) -> bool:
    """Whether a run trained to its end: FINISHED and not pruned (a candidate for a study's
    best)."""
    return status == "FINISHED" and not pruned(tags)


def pruner(study: LrStudyConfig):
    """The Optuna pruner ``lr_study`` asks for: ``median`` is Optuna's MedianPruner, comparing
    from ``prune_from_epoch`` on and once 2 trials have finished. Here, not in ``pruning``: a
    study's own process then loads no torch or transformers, only its trials do."""
    import optuna

    if study.pruner == "none":
        return optuna.pruners.NopPruner()
    if study.pruner == "median":
        warmup = study.prune_from_epoch
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup)
    raise ValueError(f"lr_study.pruner={study.pruner!r}: allowed: median, none")


def position(lr: float, span: list[float]) -> float:
    """Position of ``lr`` in ``span`` on a log scale: 0 at low, 1 at high."""
    low, high = (math.log10(x) for x in span)
    return (math.log10(lr) - low) / (high - low)


def interior(lr: float, span: list[float]) -> bool:
    """Whether ``lr`` lies inside ``span``'s outer tenths (log scale): a best lr there needs no
    wider search."""
    return 0.1 <= position(lr, span) <= 0.9


def searched(tags: Iterable[Mapping[str, str]]) -> list[float] | None:
    """The range a study's trials searched: from the lowest to the highest end of the ranges
    their runs' tags name (``RANGE_TAG``: each trial's, as its lr was drawn; the study widens
    between trials); None where none names one."""
    spans = [json.loads(t[RANGE_TAG]) for t in tags if RANGE_TAG in t]
    return [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else None
