"""Stop signals as schedulers send them (SIGTERM, SIGUSR1/2): the run ends KILLED within seconds
with its last epoch checkpoint, resumes to the numbers of an uninterrupted run, and a job that
submitit requeues continues the same MLflow run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.data import ROOT, naija_slice
from helpers.runs import run_cli
from helpers.store import logged_runs, new_store, sweep_parents
from mlflow.tracking import MlflowClient

from ablate.training import checkpoints


@pytest.fixture(scope="module")
def long_root(tmp_path_factory) -> Path:
    """Enough training sentences that an epoch lasts past a poll; few dev/test ones."""
    return naija_slice(tmp_path_factory.mktemp("signals"), "Long", 1500)


def recipe(root: Path, store: str) -> list[str]:
    return [
        "data=ud", "data.treebank=UD_Naija-Long", f"data.root={root}", "model=tiny",
        "trainer.epochs=3", "trainer.lr=1e-3", f"tracking.uri={store}",
    ]  # fmt: skip


def wait_for(condition, proc, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        assert proc.poll() is None, f"the job ended before {what}"
        time.sleep(0.05)


def history(store: str, run_id: str, key: str) -> list[float]:
    points = MlflowClient(store).get_metric_history(run_id, key)
    latest = {}
    for m in sorted(points, key=lambda m: (m.step, m.timestamp)):
        latest[m.step] = m.value
    return [latest[step] for step in sorted(latest)]


@pytest.mark.heavy
def test_sigterm_ends_the_run_killed_and_it_resumes_to_the_uninterrupted_numbers(
    long_root, tmp_path
):
    store = new_store(tmp_path)
    out = tmp_path / "first"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", *recipe(long_root, store), f"hydra.run.dir={out}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for(lambda: checkpoints.last_complete(str(out / "trainer")), proc, "checkpoint")
    proc.send_signal(signal.SIGTERM)  # mid-epoch 2: epoch 1 is checkpointed
    t0 = time.monotonic()
    proc.wait(timeout=30)
    assert time.monotonic() - t0 < 10 and proc.returncode == 128 + signal.SIGTERM
    (run,) = logged_runs(store)
    assert run.info.status == "KILLED" and run.data.tags["error"] == "stopped by SIGTERM"
    assert run.info.end_time is not None
    kept = checkpoints.last_complete(str(out / "trainer"))
    assert kept is not None and run.data.tags["ablate.checkpoint_dir"] == str(out / "trainer")

    resumed = run_cli(*recipe(long_root, store), "trainer.resume=true",
                      f"hydra.run.dir={tmp_path / 'second'}")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run,) = logged_runs(store)  # the same MLflow run, continued
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed"] == "true"
    assert not list((out / "trainer").glob("checkpoint-*"))  # cleaned once finished

    whole = new_store(tmp_path, "whole.db")  # the same run, never interrupted
    uninterrupted = run_cli(*recipe(long_root, whole), f"hydra.run.dir={tmp_path / 'whole'}")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    (reference,) = logged_runs(whole)
    for key in ("dev_accuracy", "train_loss"):
        assert history(store, run.info.run_id, key) == history(whole, reference.info.run_id, key)
    assert run.data.metrics["test_accuracy"] == reference.data.metrics["test_accuracy"]


@pytest.mark.heavy
def test_a_job_submitit_requeues_continues_the_same_run(long_root, tmp_path):
    store = new_store(tmp_path)
    sweep = tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", "--multirun", "hydra/launcher=submitit_local",
         *recipe(long_root, store), f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    wait_for(lambda: list(sweep.glob("0/trainer/checkpoint-*/trainer_state.json")), proc,
             "checkpoint")  # fmt: skip
    (run,) = logged_runs(store)
    job = json.loads(run.data.tags["ablate.process"])["pid"]  # submitit's job process
    os.kill(job, signal.SIGUSR2)  # what SLURM sends before a time limit or a preemption
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    (again,) = logged_runs(store)
    assert again.info.run_id == run.info.run_id  # the requeued job continued it
    assert again.info.status == "FINISHED" and again.data.tags["ablate.resumed"] == "true"
    assert len(history(store, run.info.run_id, "dev_accuracy")) == 3
    assert "ablate.process" not in again.data.tags  # a finished run has no liveness tags
    # the launcher's sweep is one parent run, FINISHED, with the job as its child
    (parent,) = sweep_parents(store)
    assert parent.info.status == "FINISHED"
    assert again.data.tags["mlflow.parentRunId"] == parent.info.run_id


@pytest.mark.heavy
def test_sigterm_to_a_parallel_sweep_stops_its_workers_and_ends_every_run_killed(
    long_root, tmp_path
):
    """``kill`` of a joblib sweep's process: it passes the signal on to its workers, so none trains
    on, writes to the store or takes another job after the sweep is gone."""
    import psutil

    store = new_store(tmp_path)
    sweep = tmp_path / "sweep"
    args = [a for a in recipe(long_root, store) if not a.startswith("trainer.epochs=")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", "--multirun", "hydra/launcher=workers",
         "hydra.launcher.n_jobs=2", "freeze=none,all,first2", *args, "trainer.epochs=20",
         f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    both = [f"{job}/trainer/checkpoint-*/trainer_state.json" for job in (0, 1)]
    wait_for(lambda: all(list(sweep.glob(p)) for p in both), proc, "both workers' checkpoints")
    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert alive == []  # no worker trains on
    runs = logged_runs(store)
    assert sorted(r.data.params["freeze.name"] for r in runs) == ["all", "none"]  # no 3rd job
    assert [(r.info.status, r.data.tags["error"]) for r in runs] == [
        ("KILLED", "stopped by SIGTERM")
    ] * 2
    (parent,) = sweep_parents(store)
    assert parent.info.status == "KILLED"
    assert (
        parent.data.tags["ablate.jobs"]
        == "2 KILLED, 1 of its 3 jobs without a run; stopped by SIGTERM"
    )
