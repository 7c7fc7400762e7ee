"""One freeze option's lr study on Optuna (``python -m ablate.lrstudy``): persistent, resumable,
shared by several workers, pruned, and widening its range when the best lr lies at its edge.

The study lives in Optuna's RDB storage (``lr_study.storage``; by default ``lr_study.db`` beside
a sqlite tracking store), named by the MLflow study tag and a digest of the trials' settings (lr
aside) and range, so the same command finds it again and other settings start their own. A trial
is one ``python -m ablate.train lr_study=trial ... trainer.lr=<lr>`` child process: a normal
ablate run (MLflow run tagged ``study=<name>``, job folder, checkpoints, stop signals) whose
epochs report to the trial (``ablate.lrstudy.pruning``). A child process rather than a call in
this one: a stop signal or a crash of one trial ends that run's MLflow record the way every run's
ends, and a SIGKILL of the study takes its trial with it (``pruning._die_with``).

Kill and resume: a RUNNING trial whose study process is gone (this host: its pid; any host: no
Optuna heartbeat for ``storage.GRACE_S``) is failed and queued again at its lr
(``RetryHeartbeatStaleTrialCallback``); its retry first looks for the run an earlier try ended
(not rerun), else trains in the first try's job folder (recorded with the trial: a study process
started later has a sweep folder of its own), which continues the KILLED run from its last epoch
checkpoint. Several workers: a worker asks for a trial only while finished + running
trials are fewer than the study wants or a retry is queued, and a trial that finds that many
finished, running or queued trials numbered before it (two workers asked at once) is dropped
unrun, so none is doubled.

With an ablate team server as the tracking store (an http(s) URI), the study lives in the
server's own database, reached through the server with the member's MLflow login
(``ablate.lrstudy.remote``): workers on any machine share it with no setting of their own. Where
the study lives and how it is opened: ``ablate.lrstudy.storage``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from ablate import tasks
from ablate.errors import AblateError
from ablate.lrstudy import (
    CHECK,
    PRUNED_EPOCH_TAG,
    TRIAL_ENV,
    TRIAL_TAG,
    diverged_epoch,
    interior,
    owner_here,
    position,
    pruned,
    run_ended,
)
from ablate.lrstudy.storage import open_study, sampler, storage_url
from ablate.tracking import procs
from ablate.tracking.provenance import process
from ablate.tracking.store import prepare

if TYPE_CHECKING:
    from ablate.config import LrStudyConfig, TrackingConfig, TrainCore, TrainerCore

log = logging.getLogger("ablate")

PRESET = "lr_study=trial"  # the trials' settings: conf/lr_study/trial.yaml
POLL_S = 5.0  # how often a worker waiting on others' trials looks again
ENDED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
ASKED = (  # the trials that are, or may become, finished ones
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.WAITING,
)
CUT_LIMIT = 2  # pruned or diverged trials, per finished trial wanted, before a study gives up


class Surplus(Exception):
    """The study had enough trials before this one (another worker asked at the same time)."""


@dataclass(frozen=True)
class Summary:
    """What a study did: its trials, those pruned, the epochs pruning saved, its final range."""

    name: str
    trials: int  # finished or pruned
    pruned: int
    epochs_saved: int
    epochs: int  # what all its trials would have trained unpruned
    range: tuple[float, float]
    widened: int
    best_lr: float | None
    checked: int = 0  # pruned neighbours of the best trained again unpruned

    def line(self) -> str:
        widened = f", widened {self.widened}x" if self.widened else ""
        checked = f", {self.checked} pruned beside the best trained again" if self.checked else ""
        return (
            f"study {self.name}: {self.trials} trials, {self.pruned} pruned, {self.epochs_saved} "
            f"of {self.epochs} epochs saved{checked}; lr range [{self.range[0]:g}, "
            f"{self.range[1]:g}]{widened}"
        )


def check(cfg: TrainCore) -> None:
    """One error per bad ``lr_study`` key, before a study or a run opens."""
    s = cfg.lr_study
    low, high = (list(s.range) + [0, 0])[:2]
    problems = {
        "trials": (s.trials < 1, "at least 1"),
        "range": (len(s.range) != 2 or not 0 < low < high, "[low, high] with 0 < low < high"),
        "pruner": (s.pruner not in ("median", "none"), "median or none"),
        "prune_from_epoch": (s.prune_from_epoch < 1, "at least 1"),
        "widen": (s.widen < 0, "0 or more"),
    }
    for name, (bad, allowed) in problems.items():
        if bad:
            value = OmegaConf.select(cfg, f"lr_study.{name}")
            raise AblateError(f"lr_study.{name}={value}: must be {allowed}")
    storage_url(cfg)


def target(study: optuna.Study, lr_study: LrStudyConfig) -> int:
    """Finished (unpruned) trials the study wants: ``lr_study.trials``, half as many more per
    widening, and one more per pruned neighbour of its best trained again unpruned
    (``neighbours_to_check``)."""
    widened = study.user_attrs.get("widened", 0) * math.ceil(lr_study.trials / 2)
    return lr_study.trials + widened + len(_checks(study))


def _checks(study: optuna.Study) -> set[int]:
    """The pruned trials the study has trained (or queued) again unpruned, by number."""
    return {
        t.user_attrs[CHECK]
        for t in study.get_trials(deepcopy=False)
        if CHECK in t.user_attrs and t.state != optuna.trial.TrialState.FAIL
    }


def neighbours_to_check(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The pruned trials next to the best by lr (no finished trial between them and it, on
    either side) that no unpruned trial checked yet. Median pruning judges a trial on its
    first epochs, where a high lr may still lag and then win: the region beside the best must be
    known from trials trained out, not from ones cut short. A diverged trial needs no check."""
    ended = study.get_trials(deepcopy=False, states=ENDED)
    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in ended):
        return []
    best, checked = study.best_trial, _checks(study)
    order = sorted(ended, key=lambda t: (t.params["lr"], t.number))
    at = next(i for i, t in enumerate(order) if t.number == best.number)
    found = []
    for side in (reversed(order[:at]), order[at + 1 :]):
        for t in side:
            if t.state == optuna.trial.TrialState.COMPLETE or "diverged" in t.user_attrs:
                break
            if t.number not in checked:
                found.append(t)
                break
    return found


def _check(study: optuna.Study, lr_study: LrStudyConfig) -> bool:
    """Queue an unpruned trial at the lr of each pruned neighbour of the best
    (``neighbours_to_check``); whether it did."""
    found = neighbours_to_check(study)
    for t in found:
        log.info(
            "lr study %s: trial %d (lr %.3g) was pruned beside the best (%.3g): it trains "
            "again, unpruned",
            study.study_name,
            t.number,
            t.params["lr"],
            study.best_trial.params["lr"],
        )
        study.enqueue_trial({"lr": t.params["lr"]}, user_attrs={CHECK: t.number})
    return bool(found)


def run(cfg: TrainCore, overrides: list[str], folder: Path) -> Summary:
    """Run (or continue, or help run) the study of ``cfg``'s trials until it holds its trials;
    each trial a child ``ablate.train`` with ``overrides``, its job folder under ``folder``."""
    check(cfg)
    study = open_study(cfg)
    prepare(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.stale_after_min)
    log.info("lr study %s in %s", study.study_name, storage_url(cfg))

    def objective(trial: optuna.Trial) -> float:
        return _trial(study, trial, cfg, overrides, folder)

    while True:
        _fail_dead(study)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        finished = states.count(optuna.trial.TrialState.COMPLETE)
        cut = states.count(optuna.trial.TrialState.PRUNED)
        running = states.count(optuna.trial.TrialState.RUNNING)
        # retries of killed trials, and pruned neighbours of the best to train again
        queued = states.count(optuna.trial.TrialState.WAITING)
        wanted = target(study, cfg.lr_study)
        if finished >= wanted and not running:
            if not _widen(study, cfg.lr_study) and not _check(study, cfg.lr_study):
                return summary(study, cfg.trainer)
        elif cut >= CUT_LIMIT * wanted and not running:
            log.warning(
                "lr study %s: %d trials pruned or diverged, %d of %d finished: it stops here",
                study.study_name,
                cut,
                finished,
                wanted,
            )
            return summary(study, cfg.trainer)
        elif finished + running >= wanted and not queued:
            time.sleep(POLL_S)  # other workers' trials: they may end, or die and be retried
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.optimize(objective, n_trials=1, catch=(Surplus,), gc_after_trial=False)


def _trial(
    study: optuna.Study, trial: optuna.Trial, cfg: TrainCore, overrides: list[str], folder: Path
) -> float:
    """One trial: its lr, then its run (an earlier try's, or a new child process's)."""
    ahead = [t for t in study.get_trials(deepcopy=False, states=ASKED) if t.number < trial.number]
    if len(ahead) >= target(study, cfg.lr_study):
        raise Surplus(f"trial {trial.number}: the study had its trials; dropped unrun")
    frozen = study._storage.get_trial(trial._trial_id)
    tries = [*optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(frozen), trial.number]
    job = job_folder(frozen, (folder / str(tries[0])).resolve())  # found from any directory
    trial.set_user_attr("process", {"trial": trial.number, "job": str(job), **process()})
    low, high = study.user_attrs["range"]
    study.sampler = sampler(study.study_name, cfg, trial.number)
    lr = trial.suggest_float("lr", low, high, log=True)
    checks = frozen.user_attrs.get(CHECK)  # a pruned trial's number: this one trains unpruned
    ended = _run_of(cfg.tracking, study.study_name, tries, lr)
    if ended is None:
        log.info(
            "lr study %s: trial %d at lr %.3g%s (job folder %s)",
            study.study_name,
            trial.number,
            lr,
            "" if checks is None else f", unpruned (checks trial {checks})",
            job,
        )
        env = {
            **os.environ,
            TRIAL_ENV: json.dumps(
                {
                    "storage": storage_url(cfg),
                    "study": study.study_name,
                    "trial_id": trial._trial_id,
                    "number": trial.number,
                    "driver": os.getpid(),
                    "checks": checks,
                }
            ),
        }
        command = [
            sys.executable,
            "-m",
            "ablate.train",
            PRESET,
            f"freeze={cfg.freeze.name}",
            *overrides,
            f"trainer.lr={lr!r}",
            "skip_finished=false",
            f"hydra.run.dir={job}",
        ]
        code = subprocess.run(command, env=env).returncode
        ended = _run_of(cfg.tracking, study.study_name, [trial.number], lr)
        if ended is None:
            raise AblateError(
                f"lr study {study.study_name}: trial {trial.number} (lr {lr:.3g}) failed with exit "
                f"status {code}: see its job log in {job}"
            )
    return _result(cfg, trial, ended)


def job_folder(trial: optuna.trial.FrozenTrial, new: Path) -> Path:
    """Where ``trial`` trains: a retry in the job folder its killed try trained in (recorded in
    the ``process`` attribute the retry copies), where that lies on this host, so that its run
    continues from the try's last epoch checkpoint, even when a study process started later
    (a sweep folder of its own) retries it; else ``new``."""
    earlier = trial.user_attrs.get("process", {})
    job = earlier.get("job")
    if job and earlier.get("host") == socket.gethostname() and Path(job).is_dir():
        return Path(job)
    return new


def _run_of(tracking: TrackingConfig, name: str, numbers: list[int], lr: float):
    """The MLflow run that ended trial ``numbers`` (a trial and its earlier tries) at ``lr``:
    FINISHED, pruned, or diverged; None if none did. A run tagged for the trial at another lr is
    not its: the study's Optuna storage is not the one it ran with (an archive imported into a
    new store, say), and its trial numbers drew other lrs."""
    client = MlflowClient(tracking.uri)
    exp = client.get_experiment_by_name(tracking.experiment)
    if exp is None:
        return None
    for n in numbers:
        for r in client.search_runs([exp.experiment_id], f"tags.{TRIAL_TAG} = '{name}:{n}'"):
            same_lr = math.isclose(float(r.data.params.get("trainer.lr", "nan")), lr, rel_tol=1e-9)
            if same_lr and run_ended(r.info.status, r.data.tags):
                return r
    return None


def _result(cfg: TrainCore, trial: optuna.Trial, run) -> float:
    """The trial's objective from its run; a pruned run is ended KILLED (no candidate, never
    reused by skip_finished) and the trial told PRUNED, as is one whose training diverged (its
    run stays FAILED: nothing to resume)."""
    if (epoch := diverged_epoch(run.data.tags)) is not None:
        trial.set_user_attr("epochs", epoch)
        trial.set_user_attr("diverged", epoch)
        raise optuna.TrialPruned()
    if pruned(run.data.tags):
        if run.info.status != "KILLED":
            MlflowClient(cfg.tracking.uri).set_terminated(run.info.run_id, status="KILLED")
        trial.set_user_attr("epochs", int(run.data.tags[PRUNED_EPOCH_TAG]))
        raise optuna.TrialPruned()
    trial.set_user_attr("epochs", int(run.data.metrics.get("stopped_epoch", cfg.trainer.epochs)))
    return run.data.metrics[f"best_dev_{tasks.get(cfg.data.task).primary_metric}"]


def _fail_dead(study: optuna.Study) -> None:
    """Fail and queue again the RUNNING trials whose study process on this host is gone (a
    SIGKILL), at once rather than after Optuna's heartbeat grace period."""
    storage = study._storage
    retry = storage.get_heartbeat_stale_trial_callback()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = owner_here(t)  # None: not recorded yet, an earlier try's copy, another host's
        if owner is None or procs.same(int(owner["pid"]), owner.get("started")):
            continue
        try:
            storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker got there first
        log.info(
            "lr study %s: trial %d's process %s is gone: it runs again",
            study.study_name,
            t.number,
            owner["pid"],
        )
        retry(study, storage.get_trial(t._trial_id))


def _widen(study: optuna.Study, lr_study: LrStudyConfig) -> bool:
    """When the best lr lies in the outer tenth of the range (log scale) and the study has
    widened fewer than ``lr_study.widen`` times: the range 10x wider at that edge, and more
    trials; whether it did."""
    try:
        best = study.best_trial
    except ValueError:  # no trial finished (all pruned)
        return False
    span, widened = study.user_attrs["range"], study.user_attrs.get("widened", 0)
    where = position(best.params["lr"], span)
    if interior(best.params["lr"], span) or widened >= lr_study.widen:
        return False
    wider = [span[0], span[1] * 10] if where > 0.9 else [span[0] / 10, span[1]]
    log.info(
        "lr study %s: the best lr %.3g lies at the edge of [%g, %g]: widened to [%g, %g]",
        study.study_name,
        best.params["lr"],
        *span,
        *wider,
    )
    study.set_user_attr("range", wider)
    study.set_user_attr("widened", widened + 1)
    return True


def summary(study: optuna.Study, trainer: TrainerCore) -> Summary:
    """What ``study`` did (its ended trials), of ``trainer.epochs`` each."""
    ended = study.get_trials(deepcopy=False, states=ENDED)
    cut = [t for t in ended if t.state == optuna.trial.TrialState.PRUNED]
    epochs = trainer.epochs
    saved = sum(epochs - t.user_attrs.get("epochs", len(t.intermediate_values)) for t in cut)
    done = [t for t in ended if t.state == optuna.trial.TrialState.COMPLETE]
    best = max(done, key=lambda t: t.value).params["lr"] if done else None
    span = study.user_attrs["range"]
    return Summary(
        study.study_name,
        len(ended),
        len(cut),
        saved,
        epochs * len(ended),
        (span[0], span[1]),
        study.user_attrs.get("widened", 0),
        best,
        len(_checks(study)),
    )
