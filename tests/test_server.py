"""The team server (``make server``): MLflow's basic-auth app on a PostgreSQL cluster that asks
for a password, on loopback; its members (an editor, a reader of one experiment), what it
refuses, a grid logged by the editor and reported by the reader, and its start and stop.

One server for the file (a start costs 10-30 s), started as ``make server`` starts it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import psutil
import psycopg2
import pytest
import requests
from helpers.runs import run_cli
from helpers.scale import free_port, three_sweeps_at_once
from helpers.store import logged_runs
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ablate.errors import AblateError
from ablate.server import control, members
from ablate.server.credentials import read_credentials
from ablate.server.service_user import SERVICE_USER
from ablate.tracking import procs
from ablate.tracking.auth import ENV_PASSWORD, ENV_USER, as_user
from ablate.tracking.journal import Journal, answers
from ablate.tracking.store import check_reachable, prepare

CLI = [sys.executable, "-m", "ablate.server"]
SEARCH = "/api/2.0/mlflow/experiments/search"


@pytest.fixture(scope="module")
def team():
    """The server as ``make server`` starts it, with ``ed``, an editor of every experiment, and
    ``rita``, a reader of experiments ``w0`` (the grid's) and ``notes`` (the other tests') only,
    added with the member command."""
    folder = Path(tempfile.mkdtemp(prefix="ablate-server-"))
    folder.chmod(0o755)  # the postgres user must reach it
    port, pg_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in (ENV_USER, ENV_PASSWORD)}
    started = subprocess.run(
        [*CLI, "--dir", str(folder), "start", "--port", str(port), "--pg-port", str(pg_port)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        for name, role, *only in (
            ("ed", "editor"),
            ("rita", "reader", "--experiments", "w0,notes"),
        ):
            control.main(["--dir", str(folder), "member", name, "--role", role, *only])
        creds = {n: read_credentials(members.member_file(folder, n)) for n in ("ed", "rita")}
        yield SimpleNamespace(
            uri=f"http://127.0.0.1:{port}", folder=folder, pg_port=pg_port, started=started,
            admin=read_credentials(folder / control.CREDENTIALS), **creds,
        )  # fmt: skip
    finally:
        record = folder / control.STATE
        pid = json.loads(record.read_text())["mlflow_pid"] if record.is_file() else None
        control.stop(folder)
        stopped = not (folder / "pg" / "postmaster.pid").exists()
        shutil.rmtree(folder, ignore_errors=True)
    # the server and its database are gone (the server may stay a zombie: its parent, the
    # start command, has exited)
    assert stopped and not record.exists() and not procs.alive(pid)


def status(uri: str, auth: tuple[str, str] | None) -> int:
    return requests.get(f"{uri}{SEARCH}", params={"max_results": 1}, auth=auth).status_code


def refused(call) -> int:
    """The HTTP status with which the server refuses ``call``."""
    with pytest.raises(MlflowException) as exc:
        call()
    for code in (401, 403):
        if f"error code {code} " in str(exc.value):
            return code
    raise AssertionError(str(exc.value))


def test_make_server_asks_for_a_password_and_keeps_it_to_its_owner(team):
    admin_password = team.admin[1]
    for name in (control.CREDENTIALS, control.AUTH_CONFIG, "pgpass", control.SECRET):
        mode = (team.folder / name).stat()
        assert mode.st_mode & 0o777 == 0o600, name
    # root's own secrets stay root's; the server's user gets its settings
    assert (team.folder / control.CREDENTIALS).stat().st_uid == os.geteuid()
    assert (team.folder / "pgpass").stat().st_uid == pwd.getpwnam(SERVICE_USER).pw_uid
    assert (team.folder / members.MEMBERS / "rita.credentials").stat().st_mode & 0o077 == 0
    logs = [team.started.stdout, team.started.stderr]
    logs += [(team.folder / n).read_text() for n in ("mlflow.log", "postgres/postgres.log")]
    assert not any(admin_password in text for text in logs)
    assert str(team.folder / control.CREDENTIALS) in team.started.stdout  # where to find it
    assert requests.get(f"{team.uri}/health").status_code == 200  # open: a probe finds it
    assert status(team.uri, None) == 401
    assert status(team.uri, ("admin", "not-the-password")) == 401
    assert status(team.uri, ("stranger", "a-password-123")) == 401
    assert status(team.uri, team.admin) == 200


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):  # a child that ended meanwhile
        return ""


def test_the_server_starts_no_mlflow_job_runners(team):
    # MLflow's GenAI job execution would add a runner and huey consumers of ~240 MB each
    pid = json.loads((team.folder / control.STATE).read_text())["mlflow_pid"]
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    commands = [_command(p) for p in tree]
    assert any("uvicorn" in c for c in commands), commands  # the server's own workers
    assert tree[0].environ()["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert not [c for c in commands if "huey" in c or "_job_runner" in c]


def test_the_database_lets_in_only_the_server(team):
    for host in ("127.0.0.1", str(team.folder / "postgres")):  # TCP and the socket alike
        with pytest.raises(psycopg2.OperationalError, match="password"):
            psycopg2.connect(
                host=host, port=team.pg_port, user="ablate", dbname="mlflow", passfile="/dev/null"
            )
    assert (team.folder / "pgpass").read_text().count(":ablate:") == 2  # the server's


def test_a_reader_reads_only_what_it_is_granted_and_writes_nothing(team):
    with as_user(*team.ed):
        editor = MlflowClient(team.uri)
        granted = editor.get_experiment_by_name("notes").experiment_id
        run = editor.create_run(granted).info.run_id
        editor.log_metric(run, "dev_accuracy", 0.5)
        other = editor.create_experiment("not-for-rita")
        elsewhere = editor.create_run(other).info.run_id
    with as_user(*team.rita):
        reader = MlflowClient(team.uri)
        assert reader.get_run(run).data.metrics == {"dev_accuracy": 0.5}
        assert refused(lambda: reader.log_metric(run, "dev_accuracy", 0.9)) == 403
        assert refused(lambda: reader.set_tag(run, "note", "x")) == 403
        assert refused(lambda: reader.create_run(granted)) == 403
        assert refused(lambda: reader.delete_run(run)) == 403
        # an experiment not granted to it: not listed, not readable
        assert sorted(e.name for e in reader.search_experiments()) == ["notes", "w0"]
        assert refused(lambda: reader.get_experiment(other)) == 403
        assert refused(lambda: reader.get_run(elsewhere)) == 403
    with as_user("stranger", "a-password-123"):
        assert refused(lambda: MlflowClient(team.uri).get_run(run)) == 401


def test_a_wrong_or_missing_password_is_one_line_before_training(team, tmp_path, monkeypatch):
    home = os.environ["HOME"]
    monkeypatch.delenv(ENV_USER, raising=False)
    monkeypatch.delenv(ENV_PASSWORD, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials
    with pytest.raises(AblateError, match=f"asks for a user and password: set {ENV_USER}"):
        check_reachable(team.uri)
    (tmp_path / ".mlflow").mkdir()
    (tmp_path / ".mlflow" / "credentials").write_text(
        "[mlflow]\nmlflow_tracking_username = rita\nmlflow_tracking_password = wrong-password\n"
    )
    with pytest.raises(AblateError, match=r"refused user 'rita' \(~/.mlflow/credentials\)"):
        check_reachable(team.uri)
    shutil.copy(members.member_file(team.folder, "rita"), tmp_path / ".mlflow" / "credentials")
    check_reachable(team.uri)  # the member file, as it is handed over

    monkeypatch.setenv("HOME", home)
    monkeypatch.setenv(ENV_USER, "ed")  # the environment comes before the file
    monkeypatch.setenv(ENV_PASSWORD, "wrong-password")
    proc = run_cli("model=tiny", f"tracking.uri={team.uri}", f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if f"tracking.uri={team.uri}" in x]
    assert f"refused user 'ed' ({ENV_USER}/{ENV_PASSWORD} in the environment)" in line
    assert "Traceback" not in proc.stderr and "trainable" not in proc.stderr + proc.stdout


def test_a_reader_starting_a_run_is_one_line_before_anything_loads(team, tmp_path):
    creds = {ENV_USER: team.rita[0], ENV_PASSWORD: team.rita[1]}
    for experiment in ("notes", "rita-own"):  # granted to read; not there yet
        proc = run_cli(
            "model=tiny", f"tracking.uri={team.uri}", f"tracking.experiment={experiment}",
            f"hydra.run.dir={tmp_path}/{experiment}", env=creds,
        )  # fmt: skip
        assert proc.returncode == 2
        (line,) = [x for x in proc.stderr.splitlines() if "user 'rita'" in x]
        assert f"holds READ on runs and cannot start a run in experiment '{experiment}'" in line
        assert "make member NAME=rita ROLE=editor" in line
        assert "Traceback" not in proc.stderr and "trainable" not in proc.stderr + proc.stdout
    with as_user(*team.admin):
        assert MlflowClient(team.uri).get_experiment_by_name("rita-own") is None
    for who in (team.ed, team.admin):
        with as_user(*who):
            assert prepare(team.uri, "notes")  # an editor and the admin go on
    with as_user(*team.rita), pytest.raises(AblateError, match="user 'rita' holds READ"):
        prepare(team.uri, "notes")  # their passes, kept in this process, are not hers


def test_a_refused_password_mid_run_is_an_error_not_an_outage(team, tmp_path):
    with as_user(*team.ed):
        client = MlflowClient(team.uri)
        run = client.create_run(client.get_experiment_by_name("notes").experiment_id).info.run_id
    with as_user("ed", "changed-meanwhile"):
        assert answers(team.uri)  # the server is there: nothing to wait for
        journal = Journal(tmp_path / "journal", team.uri, run)
        began = time.monotonic()
        with pytest.raises(MlflowException, match="401"):
            journal.metrics({"dev_accuracy": 0.5}, step=1)
        assert time.monotonic() - began < 10 and journal.down_since is None


def test_member_roles_and_passwords_change_with_one_command(team, capsys):
    folder = str(team.folder)
    control.main(["--dir", folder, "member", "carol", "--role", "reader"])
    assert "carol is a reader of every experiment" in capsys.readouterr().out
    old = read_credentials(members.member_file(team.folder, "carol"))
    control.main(["--dir", folder, "password", "carol"])
    new = read_credentials(members.member_file(team.folder, "carol"))
    assert new[1] != old[1]
    assert status(team.uri, old) == 401 and status(team.uri, new) == 200
    with as_user(*team.ed):
        client = MlflowClient(team.uri)
        run = client.create_run(client.get_experiment_by_name("notes").experiment_id).info.run_id
    with as_user(*new):
        assert refused(lambda: MlflowClient(team.uri).set_tag(run, "by", "carol")) == 403
    control.main(["--dir", folder, "member", "carol", "--role", "editor"])
    assert "carol is now an editor of every experiment" in capsys.readouterr().out
    with as_user(*new):  # the same password, now allowed to write
        MlflowClient(team.uri).set_tag(run, "by", "carol")
    with pytest.raises(SystemExit):
        control.main(["--dir", folder, "password", "nobody"])
    assert "no member 'nobody'" in capsys.readouterr().err


@pytest.mark.heavy
def test_a_grid_logged_by_an_editor_and_reported_by_a_reader(
    team, slice_root, tmp_path, monkeypatch
):
    monkeypatch.setenv(ENV_USER, team.ed[0])  # the editor's credentials, from the environment
    monkeypatch.setenv(ENV_PASSWORD, team.ed[1])
    # three sweeps at once, a job each (test_scale runs them with two workers on sqlite): the
    # server takes their concurrent writes
    three_sweeps_at_once(slice_root, team.uri, tmp_path, jobs=1)
    runs = logged_runs(team.uri, "w0")
    client = MlflowClient(team.uri)
    # artifacts went through the server into its artifact root
    assert {"config.yaml", "reports"} <= {
        a.path for a in client.list_artifacts(runs[0].info.run_id)
    }
    assert any((team.folder / "artifacts").rglob("config.yaml"))

    # the reader, from the credentials file it was handed
    home = tmp_path / "rita"
    (home / ".mlflow").mkdir(parents=True)
    shutil.copy(members.member_file(team.folder, "rita"), home / ".mlflow" / "credentials")
    env = {k: v for k, v in os.environ.items() if k not in (ENV_USER, ENV_PASSWORD)}
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.report", "--uri", team.uri, "--experiment", "w0",
         "--out", str(out)],
        env={**env, "HOME": str(home)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(runs)} runs used" in proc.stdout
    assert list(pd.read_csv(out / "summary.csv").strategy) == ["none"]


def test_a_server_beyond_loopback_needs_authentication_and_names_this_host(tmp_path):
    with pytest.raises(AblateError, match="beyond 127.0.0.1 needs authentication"):
        control.start(tmp_path, free_port(), 0, db_url=f"sqlite:///{tmp_path}/m.db", host="0.0.0.0")
    patterns = control.allowed_host_patterns("0.0.0.0", ("proxy.lab",))
    for name in (socket.gethostname(), "proxy.lab", "proxy.lab:*", "127.0.0.1:*"):
        assert name in patterns


def test_server_start_refuses_a_taken_port_and_stop_spares_a_reused_pid(tmp_path):
    with socket.socket() as taken:  # e.g. `make ui` on the same port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AblateError, match=rf"port {port} on 127.0.0.1 is taken"):
            control.start(tmp_path, port, free_port(), db_url=f"sqlite:///{tmp_path}/m.db")
    assert not (tmp_path / control.STATE).exists()  # nothing started, nothing recorded

    # A record whose pid now belongs to another process (the server died, the pid was reused)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        record = {"mlflow_pid": other.pid, "mlflow_started": "1"}  # another start time
        (tmp_path / control.STATE).write_text(json.dumps(record))
        control.stop(tmp_path)
        assert other.poll() is None  # left alone
        assert not (tmp_path / control.STATE).exists()  # and the stale record is gone
    finally:
        other.kill()
        other.wait()


def test_a_failed_server_start_leaves_no_postgres_running(monkeypatch):
    folder = Path(tempfile.mkdtemp(prefix="ablate-server-"))
    folder.chmod(0o755)  # the postgres user must reach it

    def fail(*args, **kwargs):  # the MLflow server failing after PostgreSQL started
        raise AblateError("mlflow server exited with code 1")

    monkeypatch.setattr(control, "_start_mlflow", fail)
    try:
        with pytest.raises(AblateError, match="exited with code 1"):
            control.start(folder, free_port(), free_port(), db_url=None)
        assert (folder / "pg" / "PG_VERSION").is_file()  # it was created and started
        assert not (folder / "pg" / "postmaster.pid").exists()  # and is stopped again
        assert not (folder / control.STATE).exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
