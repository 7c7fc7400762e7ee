"""The team server: PostgreSQL + ``mlflow server`` on loopback (``make server``), three sweeps
writing into it at once, and its start and stop."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import logged_runs
from mlflow.tracking import MlflowClient
from test_scale import free_port, three_sweeps_at_once

from ablate.errors import AblateError
from ablate.tracking import server


@pytest.fixture
def team_server():
    """PostgreSQL + mlflow server on loopback, in a folder the postgres user can reach."""
    folder = Path(tempfile.mkdtemp(prefix="ablate-server-"))
    folder.chmod(0o755)
    uri = server.start(folder, free_port(), free_port(), db_url=None)
    yield uri, folder
    server.stop(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.heavy
def test_three_parallel_sweeps_against_a_postgres_backed_server(team_server, slice_root, tmp_path):
    uri, folder = team_server
    state = (folder / server.STATE).read_text()
    # two workers each: the server, not the jobs, takes the concurrency (the sqlite test runs
    # the full three sweeps of four; so did this one, 12 of 12 FINISHED, before it was cut
    # down to keep the suite under ten minutes on two cores)
    three_sweeps_at_once(slice_root, uri, tmp_path, jobs=2)
    runs = logged_runs(uri, "w0")
    client = MlflowClient(uri)
    # artifacts went through the server into its artifact root
    assert {"config.yaml", "reports"} <= {
        a.path for a in client.list_artifacts(runs[0].info.run_id)
    }
    assert any((folder / "artifacts").rglob("config.yaml"))
    server.stop(folder)
    assert not (folder / server.STATE).exists()
    pid = json.loads(state)["mlflow_pid"]
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
