"""Scale-out: parallel joblib sweeps, submitit, the SLURM preset, and a PostgreSQL-backed server."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import logged_runs, run_cli, run_info, slice_overrides, sweep_parents
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from ablate.config import conf_dir
from ablate.errors import AblateError
from ablate.tracking import server

FREEZES = ("none", "all", "first2", "first4")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_complete_grid(uri: str, experiment: str, n: int, epochs: int = 2) -> list:
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


def three_sweeps_at_once(slice_root, uri: str, out: Path) -> None:
    """Three sweeps of four joblib workers each, started at the same moment into one store."""
    args = [
        "--multirun",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=4",
        f"freeze={','.join(FREEZES)}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1"}
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
        assert_complete_grid(uri, f"w{i}", 4)


def test_three_parallel_sweeps_into_one_fresh_sqlite_store(slice_root, tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"  # schema created once, under a lock
    three_sweeps_at_once(slice_root, uri, tmp_path)
    runs = logged_runs(uri, "w0")
    # the CPUs this process may use, divided between the 4 workers
    expected = max(1, len(os.sched_getaffinity(0)) // 4)
    threads = {run_info(uri, r.info.run_id)["environment"]["torch_threads"] for r in runs}
    assert threads == {expected}


def test_submitit_local_launcher(slice_root, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(
        "--multirun",
        *slice_overrides(slice_root, uri, tmp_path),
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        "freeze=none,first2",
        "trainer.epochs=1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_complete_grid(uri, "ablate", 2, epochs=1)


def test_slurm_preset_sets_the_knobs_a_slurm_user_needs():
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition == "gpu"
    for key in ("timeout_min", "cpus_per_task", "gpus_per_node", "mem_gb", "array_parallelism"):
        assert launcher[key] is not None


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


@pytest.fixture
def team_server():
    """PostgreSQL + mlflow server on loopback, in a folder the postgres user can reach."""
    folder = Path(tempfile.mkdtemp(prefix="ablate-server-"))
    folder.chmod(0o755)
    uri = server.start(folder, free_port(), free_port(), db_url=None)
    yield uri, folder
    server.stop(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_three_parallel_sweeps_against_a_postgres_backed_server(team_server, slice_root, tmp_path):
    uri, folder = team_server
    state = (folder / server.STATE).read_text()
    three_sweeps_at_once(slice_root, uri, tmp_path)
    runs = logged_runs(uri, "w0")
    client = MlflowClient(uri)
    # artifacts went through the server into its artifact root
    assert {"config.yaml", "reports"} <= {
        a.path for a in client.list_artifacts(runs[0].info.run_id)
    }
    assert any((folder / "artifacts").rglob("config.yaml"))
    server.stop(folder)
    assert not (folder / server.STATE).exists()
    pid = __import__("json").loads(state)["mlflow_pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not (folder / "pg" / "postmaster.pid").exists()


def test_server_start_refuses_a_taken_port_and_stop_spares_a_reused_pid(tmp_path):
    with socket.socket() as taken:  # e.g. `make ui` on the same port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AblateError, match=rf"port {port} on 127.0.0.1 is taken"):
            server.start(tmp_path, port, free_port(), db_url=f"sqlite:///{tmp_path}/m.db")
    assert not (tmp_path / server.STATE).exists()  # nothing started, nothing recorded

    # A record whose pid now belongs to another process (the server died, the pid was reused)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = {"mlflow_pid": other.pid, "mlflow_started": "1"}  # another start time
        (tmp_path / server.STATE).write_text(json.dumps(record))
        server.stop(tmp_path)
        assert other.poll() is None  # left alone
        assert not (tmp_path / server.STATE).exists()  # and the stale record is gone
    finally:
        other.kill()
        other.wait()


def test_a_failed_server_start_leaves_no_postgres_running(monkeypatch):
    folder = Path(tempfile.mkdtemp(prefix="ablate-server-"))
    folder.chmod(0o755)  # the postgres user must reach it

    def fail(*args, **kwargs):  # the MLflow server failing after PostgreSQL started
        raise AblateError("mlflow server exited with code 1")

    monkeypatch.setattr(server, "_start_mlflow", fail)
    try:
        with pytest.raises(AblateError, match="exited with code 1"):
            server.start(folder, free_port(), free_port(), db_url=None)
        assert (folder / "pg" / "PG_VERSION").is_file()  # it was created and started
        assert not (folder / "pg" / "postmaster.pid").exists()  # and is stopped again
        assert not (folder / server.STATE).exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
