"""lr studies on the team server (``make server``): the server keeps them in a database of their
own and serves it to members through Optuna's gRPC storage proxy, which asks for the member's
MLflow login. A member with nothing but the server's URL and its credentials runs a real study
there; a reader, a wrong password and an anonymous client are refused.

One server for the file, started as ``make server`` starts it (as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import grpc
import optuna
import psutil
import psycopg2
import pytest
import requests
from helpers.runs import slice_overrides
from helpers.scale import free_port
from helpers.store import logged_runs

from ablate.errors import AblateError
from ablate.lrstudy import TRIAL_TAG, remote
from ablate.lrstudy import cli as study_cli
from ablate.lrstudy import storage as lrstorage
from ablate.server import control, members
from ablate.server.credentials import read_credentials
from ablate.server.postgres import STUDIES, client_env, study_url
from ablate.server.service_user import SERVICE_USER
from ablate.tracking import procs
from ablate.tracking.auth import ENV_PASSWORD, ENV_USER, as_user

CLI = [sys.executable, "-m", "ablate.server"]


@pytest.fixture(scope="module")
def team():
    """The server as ``make server`` starts it, with ``ed``, an editor, and ``rita``, a reader,
    added with the member command."""
    folder = Path(tempfile.mkdtemp(prefix="ablate-lrstudy-"))
    folder.chmod(0o755)  # the postgres user must reach it
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in (ENV_USER, ENV_PASSWORD)}
    started = subprocess.run(
        [*CLI, "--dir", str(folder), "start", "--port", str(port)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        for name, role in (("ed", "editor"), ("rita", "reader")):
            control.main(["--dir", str(folder), "member", name, "--role", role])
        state = json.loads((folder / control.STATE).read_text())
        yield SimpleNamespace(
            uri=f"http://127.0.0.1:{port}", folder=folder, state=state,
            **{n: read_credentials(members.member_file(folder, n)) for n in ("ed", "rita")},
        )  # fmt: skip
    finally:
        control.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)
    assert not procs.alive(state["study_pid"])  # stopped with the server


@pytest.fixture
def login(monkeypatch, tmp_path):
    """Log this process (and the trials it starts) in as a member, as MLflow's env vars do;
    ``None``: nobody (and no ``~/.mlflow/credentials`` either)."""

    def as_member(user: str | None, password: str = "") -> None:
        if user is None:
            monkeypatch.setenv("HOME", str(tmp_path))
            monkeypatch.delenv(ENV_USER, raising=False)
            monkeypatch.delenv(ENV_PASSWORD, raising=False)
        else:
            monkeypatch.setenv(ENV_USER, user)
            monkeypatch.setenv(ENV_PASSWORD, password)

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    remote.discover.cache_clear()
    return as_member


def _database(team, sql: str) -> list[tuple]:
    """``sql`` in the studies' database, as the server's own role (its password file)."""
    with psycopg2.connect(
        host="127.0.0.1", port=team.state["pg_port"], user="ablate", dbname=STUDIES,
        passfile=str(team.folder / "pgpass"),
    ) as conn, conn.cursor() as cur:  # fmt: skip
        cur.execute(sql)
        return cur.fetchall()


def test_the_server_serves_studies_from_a_database_of_their_own(team):
    port = team.state["study_port"]
    # where the storage listens: named without a password (the storage asks for the login)
    assert requests.get(f"{team.uri}/ablate/lr-study-storage", timeout=30).json() == {"port": port}
    assert remote.discover(team.uri) == f"grpc://127.0.0.1:{port}"
    # run by the server's own user, not root; its database is the server role's, no superuser's
    assert psutil.Process(team.state["study_pid"]).username() == SERVICE_USER
    owner, superuser = _database(
        team,
        f"SELECT pg_get_userbyid(datdba), (SELECT rolsuper FROM pg_roles WHERE rolname = 'ablate')"
        f" FROM pg_database WHERE datname = '{STUDIES}'",
    )[0]
    assert (owner, superuser) == ("ablate", False)


def test_a_member_runs_a_study_on_the_server_with_only_its_login(team, slice_root, tmp_path, login):
    login(*team.ed)
    # one trial: each costs a process start and a run logged over HTTP
    args = [
        *slice_overrides(slice_root, team.uri, tmp_path), "freeze=bitfit", "lr_study.trials=1",
        "lr_study.pruner=none", "lr_study.widen=0", "trainer.epochs=1", "tracking.experiment=lrs",
    ]  # fmt: skip
    assert study_cli.main(args) == 0
    # the trials are in the server's database, and their runs in its MLflow store
    [(name, trials)] = _database(
        team,
        "SELECT s.study_name, count(*) FROM studies s JOIN trials t USING (study_id) "
        "WHERE t.state = 'COMPLETE' GROUP BY s.study_name",
    )
    assert trials == 1
    with as_user(*team.ed):
        runs = logged_runs(team.uri, "lrs")
    assert [r.data.tags[TRIAL_TAG] for r in runs] == [f"{name}:0"]
    # a reader reads the study; the heartbeats of its trials went through the server too
    login(*team.rita)
    study = optuna.load_study(
        study_name=name, storage=remote.TeamStorage(remote.discover(team.uri))
    )
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    assert _database(team, "SELECT count(*) FROM trial_heartbeats")[0][0] >= 1


def test_a_reader_a_wrong_password_and_no_login_are_refused(team, slice_root, tmp_path, login):
    cfg = study_cli.compose_trial(
        "bitfit", [*slice_overrides(slice_root, team.uri, tmp_path), "lr_study.trials=2"]
    )
    login(*team.rita)
    with pytest.raises(AblateError, match="rita is a reader .* needs an editor"):
        lrstorage.open_study(cfg)
    storage = remote.TeamStorage(remote.discover(team.uri))
    assert storage.get_all_studies() is not None  # a reader reads
    with pytest.raises(grpc.RpcError) as refused:  # and writes nothing, whatever the call
        storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "rita's")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    login(*team.ed)  # an editor writes studies, but deletes none (not even its own)
    storage = remote.TeamStorage(remote.discover(team.uri))
    made = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "ed's")
    with pytest.raises(grpc.RpcError) as refused:
        storage.delete_study(made)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    login("mallory", "not-a-password-0")
    with pytest.raises(AblateError, match="mallory: wrong user name or password"):
        lrstorage.open_study(cfg)
    # Optuna's own client sends no login: refused before any call reaches the database
    with warnings.catch_warnings():  # experimental in Optuna 4 and 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        anonymous = optuna.storages.GrpcStorageProxy(
            host="127.0.0.1", port=team.state["study_port"]
        )
    with pytest.raises(grpc.RpcError) as refused:
        anonymous.get_all_studies()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    login(None)
    with pytest.raises(AblateError, match="needs your MLflow login"):
        lrstorage.open_study(cfg)


def test_two_workers_seed_a_study_new_to_the_server_once(
    team, slice_root, tmp_path, login, monkeypatch
):
    """A study whose trials' runs are in the server's store but not in its storage (as after an
    archive's import into the team's store): two workers opening it at once seed it once; the
    server's storage has no lock, so they elect the one that does."""
    login(*team.ed)
    args = [
        *slice_overrides(slice_root, team.uri, tmp_path), "freeze=bitfit", "lr_study.trials=1",
        "lr_study.pruner=none", "lr_study.widen=0", "trainer.epochs=1",
        "lr_study.range=[1e-4,1e-2]", "tracking.experiment=seeded",
    ]  # fmt: skip
    assert study_cli.main(args) == 0
    cfg = study_cli.compose_trial("bitfit", study_cli.for_studies(args)[1])
    name = lrstorage.study_name(cfg)
    # as the server's own role, whose password file the server's clients read
    monkeypatch.setenv("PGPASSFILE", client_env(team.folder)["PGPASSFILE"])
    database = study_url(team.state["pg_port"])
    optuna.delete_study(study_name=name, storage=database)  # its runs stay in the store

    barrier, opened, failed = threading.Barrier(2), [], []

    def worker() -> None:
        barrier.wait()
        try:
            opened.append(lrstorage.open_study(cfg))
        except Exception as exc:  # noqa: BLE001 (re-raised below, in the test's thread)
            failed.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failed, failed
    study = optuna.load_study(
        study_name=name, storage=remote.TeamStorage(remote.discover(team.uri))
    )
    assert [t.state.name for t in study.trials] == ["COMPLETE"]  # seeded once, not twice
    assert study.user_attrs["range"] == [1e-4, 1e-2]
    assert study.user_attrs[lrstorage.SETTING_UP].count(":") == 2  # host:pid:token of one
