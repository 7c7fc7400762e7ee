"""A trial's side of an lr study, a training plugin (``LrTrial``): after each epoch its dev metric
goes to the study, which may prune it (``lr_study.pruner``); without ``trainer.threads`` it shares
the CPUs with the study's other trials (``cpus``). Active only in a trial that
``ablate.lrstudy.study`` started (it names the trial in ``$ABLATE_LR_TRIAL``); any other run
trains as usual."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from transformers import TrainerCallback

from ablate.lrstudy import (
    CHECK_TAG,
    PRUNED_EPOCH_TAG,
    PRUNED_TAG,
    RANGE_TAG,
    TRIAL_ENV,
    TRIAL_TAG,
    pruner,
)
from ablate.lrstudy.cpus import ShareCpus
from ablate.plugins import Context, Plugin
from ablate.tracking.recorder import Recorder
from ablate.training.callbacks import epoch_of

if TYPE_CHECKING:
    from ablate.config import LrStudyConfig

log = logging.getLogger("ablate")


def callbacks(
    lr_study: LrStudyConfig, record: Recorder, primary: str, threads: int | None
) -> list[TrainerCallback]:
    """The callbacks of this process's trial, if it is one (``$ABLATE_LR_TRIAL``): its reports to
    the study, with the pruner of ``lr_study``, and without ``threads`` (``trainer.threads``) its
    share of the CPUs (``ablate.lrstudy.cpus``)."""
    given = os.environ.get(TRIAL_ENV)
    if not given:
        return []
    import optuna

    trial = json.loads(given)
    _die_with(trial["driver"])
    # a team server's storage is no URL Optuna reads
    from ablate.lrstudy.storage import open_storage

    storage = open_storage(trial["storage"])
    checks = trial.get("checks")  # it trains a pruned trial's lr again: never pruned itself
    cuts = pruner(lr_study) if checks is None else optuna.pruners.NopPruner()
    study = optuna.load_study(study_name=trial["study"], storage=storage, pruner=cuts)
    # how the study finds it, and the range its lr came from (the study widens between trials)
    searched = json.dumps(study.user_attrs.get("range"))
    record.tags({TRIAL_TAG: f"{trial['study']}:{trial['number']}", RANGE_TAG: searched})
    if checks is not None:
        record.tags({CHECK_TAG: str(checks)})
    report = ReportToStudy(optuna.Trial(study, trial["trial_id"]), record, primary)
    return [report] if threads else [report, ShareCpus(study, trial["number"], record)]


class LrTrial(Plugin):
    """Adds the callbacks of this process's trial, if it is one, to the run's Trainer."""

    name = "lr_trial"

    def prepare(self, ctx: Context) -> dict[str, str]:
        """The trial's callbacks (``callbacks``); it implements no switch, so records none."""
        cfg = ctx.cfg
        ctx.callbacks += callbacks(
            cfg.lr_study, ctx.record, ctx.task.primary_metric, cfg.trainer.threads
        )
        return {}


def _die_with(driver: int) -> None:
    """Be SIGKILLed when the study's process dies (Linux): a SIGKILL of the study must not leave
    its trial training on, unseen, into the store. Done here (not in the driver's Popen
    preexec_fn, unsafe beside Optuna's heartbeat thread); a driver gone already ends us now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != driver:
        os.kill(os.getpid(), signal.SIGKILL)


class ReportToStudy(TrainerCallback):
    """Reports the primary dev metric of each epoch (step = epoch) to the trial; when the pruner
    says so, tags the run pruned and stops training after this epoch."""

    def __init__(self, trial, record: Recorder, primary: str):
        self.trial = trial
        self.record = record
        self.primary = primary

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        epoch = epoch_of(state)
        self.trial.report(metrics[f"eval_{self.primary}"], epoch)
        if epoch < round(args.num_train_epochs) and self.trial.should_prune():
            self.record.tags({PRUNED_TAG: "true", PRUNED_EPOCH_TAG: str(epoch)})
            log.info(
                "lr study: trial %d pruned after epoch %d (its dev %s is below the median "
                "of earlier trials')",
                self.trial.number,
                epoch,
                self.primary,
            )
            control.should_training_stop = True
