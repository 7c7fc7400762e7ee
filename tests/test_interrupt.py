"""Ctrl-C on a real run: one line that says where it stopped and how to continue; continuing it
finishes the same MLflow run; one stopped before its first checkpoint starts over."""

from __future__ import annotations

import shlex

import pytest
from helpers.runs import interrupted, run_cli
from helpers.store import logged_runs, new_store
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.heavy

# real Naija sentences, the tiny model: epochs of seconds, long enough to be stopped inside one
RUN = ["data=naija", "data.max_train_sentences=1500", "model=tiny", "trainer.keep_model=false"]


def killed_line(console: str) -> str:
    (line,) = [x for x in console.splitlines() if "[ERROR]" in x]
    return line


def test_ctrl_c_says_where_the_run_stopped_and_the_command_continues_it(tmp_path):
    store = new_store(tmp_path)
    args = [*RUN, "trainer.epochs=3", f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 'a'}"]
    code, console = interrupted(args, "epoch 1/3: dev accuracy", tmp_path / "a" / "trainer")
    assert code == 130
    assert "Traceback" not in console and "KeyboardInterrupt" not in console
    line = killed_line(console)
    assert "KILLED after 1 of 3 epochs; continue it with: python -m ablate.train" in line
    (run,) = logged_runs(store)
    assert run.info.status == "KILLED" and run.info.run_id in line
    # the traceback is in the job log, for whoever needs it
    assert "KeyboardInterrupt" in (tmp_path / "a" / "train.log").read_text()

    command = shlex.split(line.split("continue it with: ", 1)[1])
    assert command[:3] == ["python", "-m", "ablate.train"] and "trainer.resume=true" in command
    done = run_cli(*command[3:], f"hydra.run.dir={tmp_path / 'b'}")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = logged_runs(store)  # the same run, continued
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed"] == "true"
    assert "error" not in run.data.tags  # why it stopped then is no longer true
    assert [m.step for m in MlflowClient(store).get_metric_history(run.info.run_id,
            "dev_accuracy")] == [1, 2, 3]  # fmt: skip


def test_a_run_stopped_in_its_first_epoch_starts_over_when_resumed(tmp_path):
    store = new_store(tmp_path)
    args = [*RUN, "trainer.epochs=1", f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 'a'}"]
    code, console = interrupted(args, "params trainable")
    assert code == 130
    assert "before an epoch checkpoint (first epoch); start it over with" in killed_line(console)
    (killed,) = logged_runs(store)

    again = run_cli(*args[:-1], "trainer.resume=true", f"hydra.run.dir={tmp_path / 'b'}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to resume, so it starts over as a new run" in again.stderr + again.stdout
    (run,) = logged_runs(store)  # the KILLED one is deleted, restorable
    assert run.info.status == "FINISHED"
    assert run.data.tags["ablate.started_over"] == killed.info.run_id
    client = MlflowClient(store)
    assert client.get_run(killed.info.run_id).info.lifecycle_stage == "deleted"
