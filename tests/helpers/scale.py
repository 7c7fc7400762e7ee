"""Sweeps run side by side into one store, and the free loopback ports their servers take."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from helpers.runs import slice_overrides
from helpers.store import logged_runs, sweep_parents

FREEZES = ("none", "all", "first2", "first4")


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_complete_grid(uri: str, experiment: str, n: int, epochs: int = 2) -> list:
    """Assert ``experiment`` holds one finished sweep of ``n`` complete runs; returns the runs."""
    client = MlflowClient(uri)
    runs = logged_runs(uri, experiment)
    assert len(runs) == n
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.info.run_name for r in runs}) == n
    for r in runs:
        for key in ("dev_accuracy", "train_loss", "epoch_time_s"):
            steps = [m.step for m in client.get_metric_history(r.info.run_id, key)]
            assert sorted(steps) == list(range(1, epochs + 1)), (r.info.run_name, key)
    default = client.get_experiment_by_name("Default")
    assert default is None or not client.search_runs([default.experiment_id])
    # one sweep: its parent run FINISHED, every job its child, each with its datasets
    (parent,) = sweep_parents(uri, experiment)
    assert parent.info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parent.info.run_id}
    for r in runs:
        contexts = sorted(d.tags[0].value for d in r.inputs.dataset_inputs)
        assert contexts == ["dev", "test", "train"]
    return runs


def three_sweeps_at_once(slice_root, uri: str, out: Path, jobs: int = 2) -> None:
    """Three sweeps of ``jobs`` joblib workers each, started at the same moment into one store."""
    args = [
        "--multirun",
        "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={jobs}",
        f"freeze={','.join(FREEZES[:jobs])}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ablate.train",
                *args,
                *slice_overrides(slice_root, uri, out / f"w{i}"),
                f"tracking.experiment=w{i}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        assert "UserWarning" not in err, err[-3000:]  # Hydra's form of a failed sweep callback
    for i in range(3):
        assert_complete_grid(uri, f"w{i}", jobs)
