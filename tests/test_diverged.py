"""A run whose training diverges (``ablate.training.callbacks.StopDiverged``) stops at the end of
the epoch that shows it: one line naming the epoch and the lr, its run FAILED and tagged
``ablate.diverged``, no checkpoint left; its lr study prunes such a trial instead of failing.
The rule on the Trainer's own state objects, then a real run of the CLI."""

from __future__ import annotations

import math

import optuna
import pytest
from helpers.runs import FakeRecorder, compose_cfg, run_cli, slice_overrides
from helpers.store import logged_runs
from mlflow import MlflowClient
from transformers import TrainerControl, TrainerState, TrainingArguments

from ablate.lrstudy import seed, study
from ablate.training import DIVERGED_TAG
from ablate.training.callbacks import StopDiverged

UPOS = 17  # the pos task's labels: an untrained head starts near ln 17 = 2.83


@pytest.fixture(scope="module")
def args(tmp_path_factory) -> TrainingArguments:
    out = str(tmp_path_factory.mktemp("trainer"))
    return TrainingArguments(output_dir=out, learning_rate=3e-3, use_cpu=True, report_to="none")


def stopped(args, losses: list[float], before: list[float] = ()) -> tuple[int | None, StopDiverged]:
    """The epoch at whose end ``StopDiverged`` stops a run logging ``losses`` (None: it trains
    on), after the epochs ``before`` that a resumed run's checkpoint holds."""
    callback, state = StopDiverged(FakeRecorder(), UPOS), TrainerState()
    state.log_history = [{"loss": x, "epoch": float(i)} for i, x in enumerate(before, 1)]
    for epoch, loss in enumerate(losses, len(before) + 1):
        state.epoch = float(epoch)
        control = TrainerControl(should_evaluate=True, should_save=True)
        state.log_history.append({"loss": loss, "epoch": state.epoch})  # as Trainer.log does
        callback.on_log(args, state, control, logs={"loss": loss})
        if control.should_training_stop:
            assert not control.should_evaluate and not control.should_save  # nor scored, nor kept
            assert callback.record.tag_log == {DIVERGED_TAG: f"epoch {epoch}"}
            return epoch, callback
    assert callback.verdict is None and callback.record.tag_log == {}
    return None, callback


@pytest.mark.parametrize(
    ("losses", "epoch"),
    [
        ([2.6, 1.1, 0.7, 0.5], None),  # training
        ([25.0, 20.0], None),  # bad, but below 10 x ln 17: no blow-up
        ([0.9, 0.5, 9.5], 3),  # over ten times its first epoch's
        ([40.0, 35.0], 1),  # over ten times where an untrained head starts, at once
        ([math.nan], 1),
        ([2.6, math.inf], 2),
    ],
)
def test_a_run_stops_when_its_epochs_training_loss_blows_up(args, losses, epoch):
    assert stopped(args, losses)[0] == epoch


def test_the_verdict_names_the_epoch_the_lr_and_why(args):
    _, callback = stopped(args, [0.9, 0.5, 9.5])
    assert callback.verdict == (
        "training diverged in epoch 3 at trainer.lr=0.003 (training loss 9.5, over 10x its start "
        "0.9): stopped, its run FAILED; try a lower trainer.lr"
    )
    # a resumed run measures from its first epoch, in its checkpoint's history
    assert stopped(args, [9.5], before=[0.9, 0.5])[0] == 3
    # weights gone NaN, whose step losses the Trainer's logged loss leaves out: the dev loss
    callback, state = StopDiverged(FakeRecorder(), UPOS), TrainerState(epoch=2.0)
    control = TrainerControl(should_save=True)
    callback.on_evaluate(args, state, control, metrics={"eval_loss": math.nan})
    assert control.should_training_stop and not control.should_save
    assert callback.verdict.startswith("training diverged in epoch 2 at trainer.lr=0.003 (dev loss")


def test_a_diverging_run_is_one_line_and_its_run_failed_tagged(slice_root, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.lr=1000",
        "+tracking.tags.lr_trial=diverging:0",  # as a trial of an lr study tags its run
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in said, said[-3000:]
    (line,) = [x for x in said.splitlines() if "diverged" in x]
    assert "training diverged in epoch 1 at trainer.lr=1000 (training loss " in line, line
    (run,) = logged_runs(store)
    assert run.info.status == "FAILED" and run.data.tags[DIVERGED_TAG] == "epoch 1"
    assert "test_accuracy" not in run.data.metrics  # stopped before its test evaluation
    assert not (tmp_path / "run" / "trainer").exists()  # nothing left to resume from
    # its lr study prunes such a trial (no candidate) where a run not ended fails the study
    cfg = compose_cfg(f"tracking.uri={store}")
    assert study._run_of(cfg.tracking, "diverging", [0], 1000.0).info.run_id == run.info.run_id
    trial = optuna.create_study().ask()
    with pytest.raises(optuna.TrialPruned):
        study._result(cfg, trial, run)
    assert trial.user_attrs["epochs"] == 1
    # and a study seeded from the store (an imported archive's) holds it pruned
    (found,) = seed.trial_runs(cfg, "diverging", "accuracy")
    seeded = seed._trial(found, cfg, [1e-5, 1e-3], "accuracy", MlflowClient(store))
    assert seeded.state == optuna.trial.TrialState.PRUNED and seeded.user_attrs["epochs"] == 1
