"""Scale-out: parallel joblib sweeps, submitit, the SLURM preset, and a PostgreSQL-backed server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.runs import run_cli, slice_overrides
from helpers.scale import free_port, three_sweeps_at_once
from helpers.store import logged_runs, new_store, run_info

from ablate import config


@pytest.mark.heavy
def test_three_parallel_sweeps_into_one_fresh_sqlite_store(slice_root, tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"  # schema created once, under a lock
    three_sweeps_at_once(slice_root, uri, tmp_path)
    runs = logged_runs(uri, "w0")
    # the CPUs this process may use, divided between its sweep's 2 workers
    expected = max(1, len(os.sched_getaffinity(0)) // 2)
    threads = {run_info(uri, r.info.run_id)["environment"]["torch_threads"] for r in runs}
    assert threads == {expected}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs to tell the mask apart")
def test_a_job_under_taskset_beside_a_busy_process_takes_one_thread_and_sleeps_when_idle(
    slice_root, tmp_path
):
    uri = new_store(tmp_path)
    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        proc = run_cli(
            *slice_overrides(slice_root, uri, tmp_path), "trainer.epochs=1",
            prefix=("taskset", "-c", "0"),
        )  # fmt: skip
    finally:
        busy.kill()
        busy.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = logged_runs(uri)
    environment = run_info(uri, run.info.run_id)["environment"]
    assert environment["torch_threads"] == 1  # the affinity mask, not the machine's CPUs
    # its core is shared: OpenMP's threads sleep when idle (set before torch loaded it)
    assert environment["omp_wait_policy"].startswith("PASSIVE (auto: "), environment
    # ... which its time carries: the report counts it as timed beside other work
    assert run.data.metrics["busy_cpus_at_start"] >= 0.5


def test_slurm_cpus_per_task_caps_the_threads(monkeypatch):
    from ablate.training.resources import usable_cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(128)))  # a big node
    assert usable_cpus() == 128
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert usable_cpus() == 4


def test_slurm_preset_sets_the_knobs_a_slurm_user_needs():
    cfg = config.compose("hydra/launcher=slurm", "hydra.launcher.partition=gpu", hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition == "gpu"
    for key in ("timeout_min", "cpus_per_task", "gpus_per_node", "mem_gb", "array_parallelism"):
        assert launcher[key] is not None
    # a timed-out job is requeued (submitit's default is never) and warned before the limit
    assert launcher.max_num_timeout >= 1 and launcher.signal_delay_s >= 60


def test_unreachable_server_fails_before_training(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = run_cli("model=tiny", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert f"tracking.uri={uri}: no MLflow server answers" in proc.stderr
    assert "Traceback" not in proc.stderr and "trainable" not in proc.stderr + proc.stdout


def test_unwritable_store_fails_before_training(tmp_path):
    proc = run_cli(
        "model=tiny", "tracking.uri=sqlite:////proc/ablate/mlflow.db", f"hydra.run.dir={tmp_path}"
    )
    assert proc.returncode == 2
    assert (
        "tracking.uri=sqlite:////proc/ablate/mlflow.db: cannot create /proc/ablate" in proc.stderr
    )
