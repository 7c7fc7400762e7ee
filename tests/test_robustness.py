"""Interrupted runs, resumable sweeps, reproducibility: real processes, real store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, run_cli, slice_overrides
from mlflow.tracking import MlflowClient

from ablate import tracking


def runs_in(store: str, experiment: str = "ablate"):
    client = MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id]) if exp else []


def test_killed_run_is_marked_killed_and_resumes_into_the_same_run(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = [
        "data=naija", "data.max_train_sentences=2000", "model=tiny", "trainer.epochs=3",
        f"tracking.uri={store}",
    ]  # fmt: skip
    out = tmp_path / "first"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", *common, f"hydra.run.dir={out}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not list((out / "trainer").glob("checkpoint-*/trainer_state.json")):
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # mid-epoch 2: epoch 1 is checkpointed
    proc.wait()

    client, (run,) = runs_in(store)
    assert run.info.status == "RUNNING"  # what a SIGKILL leaves behind
    done = [m.step for m in client.get_metric_history(run.info.run_id, "dev_accuracy")]
    assert done and max(done) < 3

    exp_id = tracking.prepare(store, "ablate", stale_after_min=30)  # the next start
    run = client.get_run(run.info.run_id)
    assert run.info.status == "KILLED"
    assert "is gone" in run.data.tags["ablate.killed_reason"]
    assert exp_id == run.info.experiment_id

    resumed = run_cli(*common, "trainer.resume=true", f"hydra.run.dir={tmp_path / 'second'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client, runs = runs_in(store)
    assert len(runs) == 1  # continued the same MLflow run
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed"] == "true"
    history = client.get_metric_history(run.info.run_id, "dev_accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert run.data.metrics["best_dev_accuracy"] == max(m.value for m in history)
    assert "test_accuracy" in run.data.metrics
    assert not list((out / "trainer").glob("checkpoint-*"))  # cleaned once finished


def test_skip_finished_reruns_only_the_missing_jobs_of_a_grid(slice_root, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    base = [*slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1"]
    first = run_cli("--multirun", *base, "freeze=none,all")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli(
        "--multirun", *base, "freeze=none,all,first2", "skip_finished=true",
        f"hydra.sweep.dir={tmp_path / 'again'}",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    _, runs = runs_in(store)
    assert sorted(r.data.params["freeze"] for r in runs) == ["all", "first2", "none"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert (again.stdout + again.stderr).count("skip_finished: identical config") == 2


def test_same_seed_gives_identical_dev_metrics_and_a_full_record(slice_root, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli("--multirun", *slice_overrides(slice_root, store, tmp_path), "seed=7,7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = runs_in(store)
    assert len(runs) == 2
    histories = [
        [
            m.value
            for m in sorted(
                client.get_metric_history(r.info.run_id, "dev_accuracy"), key=lambda m: m.step
            )
        ]
        for r in runs
    ]
    assert histories[0] == histories[1]
    assert runs[0].data.metrics["test_accuracy"] == runs[1].data.metrics["test_accuracy"]
    tags = runs[0].data.tags
    assert tags["ablate.identity"] == runs[1].data.tags["ablate.identity"]
    for package in ("torch", "transformers", "peft", "mlflow", "hydra-core"):
        assert tags[f"versions.{package}"] not in ("", "absent")
    assert tags["device"] == "cpu" and tags["git.dirty"] in ("True", "False")


def test_identity_ignores_where_runs_go_but_not_what_they_compute():
    from hydra import compose, initialize_config_dir

    from ablate.config import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        base = tracking.identity(compose("train"))
        same = compose("train", overrides=["tracking.uri=sqlite:////x.db", "trainer.resume=true"])
        other = compose("train", overrides=["trainer.lr=1e-4"])
    assert tracking.identity(same) == base
    assert tracking.identity(other) != base


@pytest.mark.parametrize("beat_age_min", [5, 45])
def test_runs_without_a_heartbeat_from_another_host_are_killed_only_when_stale(
    tmp_path, beat_age_min
):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp_id = tracking.prepare(store, "ablate")
    client = MlflowClient(store)
    beat = f"{time.time() - beat_age_min * 60:.0f}"
    tags = {"host": "elsewhere", "ablate.pid": "1", "ablate.heartbeat": beat}
    run = client.create_run(exp_id, tags=tags)
    killed = tracking.mark_stale_runs(client, exp_id, stale_after_s=30 * 60)
    assert killed == ([run.info.run_id] if beat_age_min > 30 else [])
    assert client.get_run(run.info.run_id).info.status == (
        "KILLED" if beat_age_min > 30 else "RUNNING"
    )
