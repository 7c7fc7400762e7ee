"""A new Optuna study seeded from the trial runs its tracking store already holds: an archive's
import (``python -m ablate.archive import``) brings a study's runs to a new store, not its
Optuna storage, so the same ``python -m ablate.lrstudy`` command there would number its trials
afresh and train every one again. Seeded, each ended run is its trial again (lr, range, value
or pruned state, per-epoch dev metric), at its tagged number, and the study's range and
widenings are restored: the study trains only what is missing."""

from __future__ import annotations

import json
import logging
import math
from datetime import datetime
from typing import TYPE_CHECKING

import optuna
from mlflow.tracking import MlflowClient
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from ablate import tasks
from ablate.lrstudy import (
    CHECK,
    CHECK_TAG,
    PRUNED_EPOCH_TAG,
    RANGE_TAG,
    TRIAL_TAG,
    diverged_epoch,
    pruned,
    run_ended,
)
from ablate.tracking.store import all_runs, schema_lock

if TYPE_CHECKING:
    from ablate.config import TrainCore

log = logging.getLogger("ablate")


def trial_runs(cfg: TrainCore, name: str, metric: str) -> list:
    """The ended runs of study ``name``'s trials in ``cfg``'s experiment (pruned, or FINISHED:
    ``study._run_of``'s rule; a FINISHED one with its ``best_dev_<metric>``, the trial's value),
    by trial number, then start time."""
    with schema_lock(cfg.tracking.uri):  # the store may be fresh: MLflow migrates it on open
        client = MlflowClient(cfg.tracking.uri)
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
    if exp is None:
        return []
    # LIKE narrows the search; "_" in a name is LIKE's any-character, so the prefix is checked
    # again exactly below
    pattern = f"{name}:%".replace("'", "\\'")
    runs = all_runs(client, exp.experiment_id, f"tags.{TRIAL_TAG} LIKE '{pattern}'")
    kept = []
    for r in runs:
        prefix, _, number = r.data.tags[TRIAL_TAG].rpartition(":")
        # ended, and with its value where it trained out (a pruned or diverged trial has none)
        valued = _cut(r.data.tags) or f"best_dev_{metric}" in r.data.metrics
        if prefix == name and number.isdigit() and run_ended(r.info.status, r.data.tags) and valued:
            kept.append((int(number), r.info.start_time, r))
    return [r for *_, r in sorted(kept, key=lambda x: x[:2])]


def _cut(tags) -> bool:
    """Whether a trial's run is a pruned trial: its study pruned it, or its training diverged."""
    return pruned(tags) or diverged_epoch(tags) is not None


def _marks(tags) -> dict:
    """The trial's user attributes its run's tags record: the pruned trial it checks, the epoch
    it diverged in (``ablate.lrstudy.study`` reads both)."""
    marks = {}
    if CHECK_TAG in tags:
        marks[CHECK] = int(tags[CHECK_TAG])
    if (epoch := diverged_epoch(tags)) is not None:
        marks["diverged"] = epoch
    return marks


def _span(run) -> list[float] | None:
    """The [low, high] range the run's lr was drawn from (its ``RANGE_TAG``), if it names one."""
    try:
        low, high = (float(x) for x in json.loads(run.data.tags[RANGE_TAG]))
    except (KeyError, TypeError, ValueError):
        return None
    return [low, high] if 0 < low < high else None


def widenings(configured: list[float], span: list[float]) -> int | None:
    """How many times ``configured`` was widened into ``span`` (each widening: one edge 10x
    further out); None if ``span`` is no such widening of it."""
    low, high = configured
    if span[0] > low or span[1] < high:
        return None
    out = math.log10(low / span[0]) + math.log10(span[1] / high)
    return round(out) if math.isclose(out, round(out), abs_tol=1e-6) else None


def _trial(run, cfg: TrainCore, configured: list[float], metric: str, client: MlflowClient):
    """The finished Optuna trial of ``run``: its lr from its range, its value or pruned state,
    its per-epoch dev metric as ``ablate.lrstudy.pruning`` reported it (step = epoch)."""
    lr = float(run.data.params["trainer.lr"])
    low, high = _span(run) or configured
    dist = FloatDistribution(min(low, lr), max(high, lr), log=True)  # a range it lay outside
    history: dict[int, float] = {}
    points = client.get_metric_history(run.info.run_id, f"dev_{metric}")
    for m in sorted(points, key=lambda m: m.timestamp):
        history.setdefault(int(m.step), m.value)  # a step reported twice: Optuna keeps the first
    cut = _cut(run.data.tags)
    if cut:
        epochs = diverged_epoch(run.data.tags) or int(
            run.data.tags.get(PRUNED_EPOCH_TAG, max(history, default=0))
        )
    else:
        epochs = int(run.data.metrics.get("stopped_epoch", cfg.trainer.epochs))
    trial = optuna.trial.create_trial(
        state=TrialState.PRUNED if cut else TrialState.COMPLETE,
        value=None if cut else run.data.metrics[f"best_dev_{metric}"],
        params={"lr": lr},
        distributions={"lr": dist},
        user_attrs={"epochs": epochs, "seeded_from_run": run.info.run_id, **_marks(run.data.tags)},
        intermediate_values=history,
    )
    if run.info.end_time:  # the run's own times, naive local as Optuna's own
        trial.datetime_start = datetime.fromtimestamp(run.info.start_time / 1000)
        trial.datetime_complete = datetime.fromtimestamp(run.info.end_time / 1000)
    return trial


def seed(study: optuna.Study, cfg: TrainCore) -> None:
    """Add to ``study`` (new: no ``range`` yet) a trial per ended run of its trials in the
    tracking store, and set its ``range`` and ``widened``: the configured range, or the widest one
    those runs were drawn from (a widening widens it for every later trial). The ``range`` comes
    last: a seeding killed before it is finished by the next one, which adds only the trials
    after those already there (Optuna adds a trial per transaction).

    Each run's trial gets the number in its tag: a number no ended run holds (a failed trial, a
    retried one) becomes a FAIL trial, so a trial asked later is numbered after them all and its
    run's tag names no other run. Runs sharing a number (trials of a study whose storage was
    replaced unseeded) go after the rest."""
    configured = [float(x) for x in cfg.lr_study.range]
    metric = tasks.get(cfg.data.task).primary_metric
    runs = trial_runs(cfg, study.study_name, metric)
    span, widened = configured, 0
    for r in runs:
        got = _span(r)
        times = widenings(configured, got) if got else None
        if times is not None and times > widened:
            span, widened = got, times
    if runs:
        client = MlflowClient(cfg.tracking.uri)
        placed, extra = {}, []
        for r in runs:
            number = int(r.data.tags[TRIAL_TAG].rpartition(":")[2])
            if number in placed:
                extra.append(r)
            else:
                placed[number] = r
        trials = []
        for number in range(max(placed) + 1):
            if number in placed:
                trials.append(_trial(placed[number], cfg, configured, metric, client))
            else:
                gap = {"seeded_gap": True}
                trials.append(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=gap))
        trials += [_trial(r, cfg, configured, metric, client) for r in extra]
        study.add_trials(trials[len(study.get_trials(deepcopy=False)) :])
        n_pruned = sum(t.state == TrialState.PRUNED for t in trials)
        log.info(
            "lr study %s: seeded %d trials (%d pruned) from the tracking store's runs; "
            "range [%g, %g]%s",
            study.study_name,
            len(runs),
            n_pruned,
            *span,
            f", widened {widened}x" if widened else "",
        )
    study.set_user_attr("range", span)
    study.set_user_attr("widened", widened)
