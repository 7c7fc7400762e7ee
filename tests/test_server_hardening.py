"""The team server attacked from inside, as a member would (an editor, a reader of one
experiment, another local user of the host), against a real server started as root the way
``make server`` starts it: each attack fails.

One server for the file (with a 1 MB upload limit); the failed-login tests come last, since
they lock this host's address out."""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import psutil
import psycopg2
import pytest
import requests
from helpers.scale import free_port

from ablate.errors import AblateError
from ablate.server import control, members, postgres, service_user
from ablate.server.credentials import read_credentials
from ablate.server.passwords import password_problem
from ablate.server.service_user import SERVICE_USER
from ablate.tracking.auth import ENV_PASSWORD, ENV_USER

CLI = [sys.executable, "-m", "ablate.server"]
API = "/api/2.0/mlflow"
PROXY = "/api/2.0/mlflow-artifacts/artifacts"
STRONG = "tidal-Orchid-58-velvet"


@pytest.fixture(scope="module")
def srv():
    """The server as ``make server`` starts it (as root), with ``ed``, an editor, and ``rita``,
    a reader of experiment ``notes`` only, added with ``make member``'s command."""
    folder = Path(tempfile.mkdtemp(prefix="ablate-hard-"))
    folder.chmod(0o755)  # the postgres user must reach it
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in (ENV_USER, ENV_PASSWORD)}
    cli = [*CLI, "--dir", str(folder)]
    started = subprocess.run(
        [*cli, "start", "--port", str(port), "--max-upload-mb", "1"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        added = subprocess.run(
            [*cli, "member", "ed", "--role", "editor"], capture_output=True, text=True, env=env
        )
        assert added.returncode == 0 and "Warning" not in added.stderr, added.stderr
        control.main(["--dir", str(folder), "member", "rita", "--role", "reader",
                     "--experiments", "notes"])  # fmt: skip
        yield SimpleNamespace(
            uri=f"http://127.0.0.1:{port}", folder=folder,
            admin=read_credentials(folder / control.CREDENTIALS),
            ed=read_credentials(members.member_file(folder, "ed")),
            rita=read_credentials(members.member_file(folder, "rita")),
        )  # fmt: skip
    finally:
        control.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


def call(srv, method: str, path: str, auth=None, **kwargs) -> requests.Response:
    return requests.request(method, f"{srv.uri}{path}", auth=auth, timeout=30, **kwargs)


def new_run(srv, experiment: str) -> tuple[str, str]:
    """(experiment id, run id) of a new run of the editor's in ``experiment``."""
    found = call(srv, "GET", f"{API}/experiments/get-by-name", srv.ed,
                 params={"experiment_name": experiment})  # fmt: skip
    if found.status_code == 200:
        exp = found.json()["experiment"]["experiment_id"]
    else:
        exp = call(srv, "POST", f"{API}/experiments/create", srv.ed, json={"name": experiment})
        exp = exp.json()["experiment_id"]
    run = call(srv, "POST", f"{API}/runs/create", srv.ed, json={"experiment_id": exp})
    return exp, run.json()["run"]["info"]["run_id"]


def test_only_the_documented_routes_answer_without_a_password(srv):
    assert call(srv, "GET", "/health").status_code == 200
    info = call(srv, "GET", "/api/3.0/mlflow/server-info")
    assert info.status_code == 200 and "SqlStore" in info.text  # its settings, no data
    assert call(srv, "GET", "/static-files/favicon.svg").status_code in (200, 404)
    closed = ["/", "/version", "/graphql", "/signup", "/get-artifact", "/metrics"]
    closed += [f"{API}/experiments/search", f"{PROXY}/0/x", "/ajax-api/2.0/mlflow/users/list"]
    for path in closed:
        assert call(srv, "GET", path).status_code == 401, path


def test_a_malformed_authorization_header_is_a_401(srv):
    for header in ("Bearer abc", "Basic !!!", f"Basic {base64.b64encode(b'nocolon').decode()}",
                   "Digest username=admin"):  # fmt: skip
        answer = call(srv, "GET", f"{API}/experiments/search", headers={"Authorization": header})
        assert answer.status_code == 401 and "Traceback" not in answer.text, header


def test_experiments_live_in_the_servers_store_whoever_asks(srv):
    for who in (srv.admin, srv.ed, srv.rita):
        for place in ("file:///tmp/ablate-leak", "s3://bucket/x", "dbfs:/x", "models:/m/1"):
            body = {"name": f"at-{uuid.uuid4().hex[:6]}", "artifact_location": place}
            answer = call(srv, "POST", f"{API}/experiments/create", who, json=body)
            assert answer.status_code == 400 and "artifact_location" in answer.text, place
        # the body as MLflow also reads it: posted double-encoded
        twice = json.dumps(json.dumps({"name": "twice", "artifact_location": "file:///tmp/x"}))
        answer = call(srv, "POST", f"{API}/experiments/create", who, data=twice,
                      headers={"Content-Type": "application/json"})  # fmt: skip
        assert answer.status_code == 400, answer.text
    assert not Path("/tmp/ablate-leak").exists()


def test_an_artifact_location_is_refused_however_it_is_spelled(srv):
    other, _ = new_run(srv, "someone-elses")
    places = ["file:///tmp/ablate-leak", "s3://bucket/x", "gs://b/x", "dbfs:/x"]
    places += ["mlflow-artifacts:/../../", "/tmp/ablate-leak", f"mlflow-artifacts:/{other}"]
    for who in (srv.admin, srv.ed):
        for key in ("artifactLocation", "artifact_location"):
            for place in places:
                body = {"name": f"at-{uuid.uuid4().hex[:6]}", key: place}
                answer = call(srv, "POST", f"{API}/experiments/create", who, json=body)
                assert answer.status_code == 400 and "artifact_location" in answer.text, place
        answer = call(srv, "POST", f"{API}/experiments/create", who,
                      json={"name": f"plain-{uuid.uuid4().hex[:6]}"})  # fmt: skip
        assert answer.status_code == 200, answer.text  # without one, as before
    assert not Path("/tmp/ablate-leak").exists()


def test_no_run_is_created_where_an_experiment_keeps_artifacts_outside(srv):
    exp, _ = new_run(srv, "moved-out")
    state = json.loads((srv.folder / control.STATE).read_text())
    url = os.environ.get("PGPASSFILE")
    os.environ["PGPASSFILE"] = str(srv.folder / "pgpass")
    try:  # an experiment made before the server refused such locations
        with psycopg2.connect(host="127.0.0.1", port=state["pg_port"], user="ablate",
                              dbname="mlflow") as db:  # fmt: skip
            db.cursor().execute(
                "UPDATE experiments SET artifact_location = %s WHERE experiment_id = %s",
                ("file:///tmp/ablate-leak", int(exp)),
            )
    finally:
        os.environ.pop("PGPASSFILE") if url is None else os.environ.update(PGPASSFILE=url)
    for who in (srv.admin, srv.ed):
        answer = call(srv, "POST", f"{API}/runs/create", who, json={"experiment_id": exp})
        assert answer.status_code == 400 and "outside this server's store" in answer.text
    fine, _ = new_run(srv, "stays-in")
    assert fine


def test_a_trace_id_is_one_plain_name(srv):
    exp, _ = new_run(srv, "traces")
    for bad in ("../../2/traces/tr-0123", "tr-ok/../../x", "a/b"):
        trace = {"trace_info": {"trace_id": bad, "trace_location": {
            "type": "MLFLOW_EXPERIMENT", "mlflow_experiment": {"experiment_id": exp}}}}  # fmt: skip
        answer = call(srv, "POST", "/api/3.0/mlflow/traces", srv.ed, json={"trace": trace})
        assert answer.status_code == 400 and "trace id" in answer.text, bad
        # a read by such an id is refused too (MLflow finds no trace, or ablate's check)
        read = call(srv, "GET", f"{API}/get-trace-artifact", srv.ed, params={"request_id": bad})
        assert read.status_code in (400, 403), bad


def test_every_request_body_has_a_size_limit_whatever_its_encoding(srv):
    exp, run = new_run(srv, "bodies")
    body = b'{"run_id": "' + run.encode() + b'", "metrics": []' + b" " * 2**20 + b"}"
    for who in (srv.rita, srv.ed):
        sized = call(srv, "POST", f"{API}/runs/log-batch", who, data=body,
                     headers={"Content-Type": "application/json"})  # fmt: skip
        assert sized.status_code == 413, sized.text
        chunks = iter([body[i : i + 65536] for i in range(0, len(body), 65536)])
        chunked = call(srv, "POST", f"{API}/runs/log-batch", who, data=chunks,
                       headers={"Content-Type": "application/json"})  # fmt: skip
        assert chunked.status_code == 413, chunked.text
        graphql = call(srv, "POST", "/graphql", who, data=iter([b"{" + b" " * 2**20 + b"}"]),
                       headers={"Content-Type": "application/json"})  # fmt: skip
        assert graphql.status_code == 413, graphql.text
    point = {"key": "m", "value": 1.0, "timestamp": 1, "step": 0}
    small = call(
        srv, "POST", f"{API}/runs/log-batch", srv.ed, json={"run_id": run, "metrics": [point]}
    )
    assert small.status_code == 200, small.text


def test_the_artifact_routes_never_follow_a_symlink_out_of_the_store(srv):
    exp, run = new_run(srv, "links")
    base = f"{PROXY}/{exp}/{run}/artifacts"
    assert call(srv, "PUT", f"{base}/ok.txt", srv.ed, data=b"fine").status_code == 200
    # a link planted in the run's folder (root stands in for whoever could write there)
    link = srv.folder / "artifacts" / exp / run / "artifacts" / "leak"
    link.symlink_to(srv.folder)
    admin_password = srv.admin[1]
    for method, path, kwargs in (
        ("GET", "/get-artifact", {"params": {"run_uuid": run, "path": "leak/credentials"}}),
        ("GET", f"{base}/leak/credentials", {}),
        ("GET", f"{API}/artifacts/list", {"params": {"run_id": run, "path": "leak"}}),
        ("PUT", f"{base}/leak/planted.txt", {"data": b"x"}),
    ):
        for who in (srv.ed, srv.admin):
            answer = call(srv, method, path, who, **kwargs)
            assert answer.status_code >= 400 and admin_password not in answer.text, (path, who)
    assert not (srv.folder / "planted.txt").exists()
    got = call(srv, "GET", "/get-artifact", srv.ed, params={"run_uuid": run, "path": "ok.txt"})
    assert got.text == "fine"  # the store itself still serves


def test_a_reader_creates_nothing_and_an_editor_what_it_is_granted(srv):
    exp, run = new_run(srv, "notes")
    refused = {
        "experiment": ("POST", f"{API}/experiments/create", {"json": {"name": "ritas"}}),
        "run": ("POST", f"{API}/runs/create", {"json": {"experiment_id": exp}}),
        "logged model": ("POST", "/api/2.0/mlflow/logged-models", {"json": {"experiment_id": exp}}),
        "registered model": ("POST", f"{API}/registered-models/create", {"json": {"name": "m"}}),
        "upload": ("PUT", f"{PROXY}/{exp}/{run}/artifacts/r.txt", {"data": b"x"}),
        "users": ("GET", f"{API}/users/list", {}),
        "another user": ("GET", f"{API}/users/get", {"params": {"username": "ed"}}),
    }
    for what, (method, path, kwargs) in refused.items():
        assert call(srv, method, path, srv.rita, **kwargs).status_code == 403, what
    mine = call(srv, "GET", f"{API}/users/get", srv.rita, params={"username": "rita"})
    assert mine.status_code == 200
    assert call(srv, "GET", f"{API}/users/list", srv.admin).status_code == 200
    # the editor: experiments, runs, uploads
    assert call(srv, "POST", f"{API}/experiments/create", srv.ed,
                json={"name": "eds"}).status_code == 200  # fmt: skip
    assert call(srv, "GET", f"{API}/users/list", srv.ed).status_code == 403


def test_no_member_reaches_the_host_through_mlflows_assistant_or_ai_gateway(srv, tmp_path):
    # the Assistant trusts any caller on the host: a reader could point it at host folders and
    # have it write files anywhere the server's user may
    target = tmp_path / "skills"
    tmp_path.chmod(0o777)
    base = "/ajax-api/3.0/mlflow/assistant"
    for who in (srv.rita, srv.ed, srv.admin):
        attempts = [
            ("GET", f"{base}/config", None),
            ("PUT", f"{base}/config", {"providers": {"claude_code": {"selected": True}}}),
            ("POST", f"{base}/skills/install", {"type": "custom", "custom_path": str(target)}),
            ("POST", f"{base}/message", {"message": "ls /"}),
        ]
        for method, path, body in attempts:
            answer = call(srv, method, path, who, json=body)
            assert answer.status_code == 403 and "no MLflow Assistant" in answer.text, path
    assert not target.exists()
    # nor through its AI Gateway: its keys and endpoints would send requests from the host
    secret = {"secret_name": "k", "secret_value": {"api_key": "x"}, "provider": "openai"}
    for who in (srv.rita, srv.ed):
        made = call(srv, "POST", "/api/3.0/mlflow/gateway/secrets/create", who, json=secret)
        assert made.status_code in (403, 501) and "secret_id" not in made.text, made.text
    assert call(srv, "GET", "/api/3.0/mlflow/server-info").json()["features_enabled"] == {
        "gateway": False
    }  # the UI leaves the gateway out
    listed = call(srv, "GET", f"{API}/experiments/search", srv.rita, params={"max_results": 5})
    assert listed.status_code == 200  # the rest of the server answers her as before


def test_uploads_have_a_size_limit(srv):
    exp, run = new_run(srv, "sizes")
    base = f"{PROXY}/{exp}/{run}/artifacts"
    assert call(srv, "PUT", f"{base}/small.bin", srv.ed, data=b"0" * 2**19).status_code == 200
    big = call(srv, "PUT", f"{base}/big.bin", srv.ed, data=b"0" * (2**20 + 1))
    assert big.status_code == 413 and "1 MB" in big.text
    chunked = call(srv, "PUT", f"{base}/chunked.bin", srv.ed, data=iter([b"0" * 1024]))
    assert chunked.status_code == 411
    assert not list((srv.folder / "artifacts").rglob("big.bin"))


def test_a_password_is_long_and_uncommon_wherever_it_is_set(srv):
    for weak in ("password1234", "short-1", "Qwerty123456!", "111111111111", "mlflow-2026!!"):
        assert password_problem(weak), weak
        answer = call(srv, "POST", f"{API}/users/create", srv.admin,
                      json={"username": "weak", "password": weak})  # fmt: skip
        assert answer.status_code == 400 and "password" in answer.text, weak
    created = call(srv, "POST", f"{API}/users/create", srv.admin,
                   json={"username": "weak", "password": STRONG})  # fmt: skip
    assert created.status_code == 200
    change = {"username": "weak", "current_password": STRONG}
    assert call(srv, "PATCH", f"{API}/users/update-password", ("weak", STRONG),
                json={**change, "password": "letmein12345"}).status_code == 400  # fmt: skip
    assert call(srv, "PATCH", f"{API}/users/update-password", ("weak", STRONG),
                json={**change, "password": STRONG + "-2"}).status_code == 200  # fmt: skip


def test_the_server_runs_as_its_own_user_with_root_files_out_of_reach(srv):
    state = json.loads((srv.folder / control.STATE).read_text())
    assert psutil.Process(state["mlflow_pid"]).username() == SERVICE_USER
    top = srv.folder.stat()
    assert top.st_uid == 0 and stat.S_IMODE(top.st_mode) == 0o711  # never postgres's
    owners = {p.name: pwd.getpwuid(p.stat().st_uid).pw_name for p in srv.folder.iterdir()}
    assert {n for n, o in owners.items() if o == "postgres"} == {"pg", "postgres"}
    assert owners[control.LOG] == owners[control.CREDENTIALS] == owners["members"] == "root"
    # the server's user reads neither the admin's nor a member's credentials
    for secret in (srv.folder / control.CREDENTIALS, members.member_file(srv.folder, "ed")):
        peek = subprocess.run(["runuser", "-u", SERVICE_USER, "--", "cat", str(secret)],
                              capture_output=True, text=True)  # fmt: skip
        assert peek.returncode != 0 and "Permission denied" in peek.stderr
    # the database role owns its database and is no superuser: no program runs through it
    url = os.environ.get("PGPASSFILE")
    os.environ["PGPASSFILE"] = str(srv.folder / "pgpass")
    try:
        pg_port = state["pg_port"]
        with psycopg2.connect(host="127.0.0.1", port=pg_port, user="ablate", dbname="mlflow") as db:
            cur = db.cursor()
            cur.execute("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = 'ablate'")
            assert cur.fetchone() == (False, False)
            with pytest.raises(psycopg2.errors.InsufficientPrivilege):
                cur.execute("COPY (SELECT 1) TO PROGRAM 'id'")
    finally:
        os.environ.pop("PGPASSFILE") if url is None else os.environ.update(PGPASSFILE=url)


def test_no_secret_stays_in_a_server_process_environment_or_its_config(srv):
    state = json.loads((srv.folder / control.STATE).read_text())
    server = psutil.Process(state["mlflow_pid"])
    password = srv.admin[1].encode()
    secret = (srv.folder / control.SECRET).read_bytes().strip()
    for process in (server, *server.children(recursive=True)):
        environ = Path(f"/proc/{process.pid}/environ").read_bytes()
        assert password not in environ and secret not in environ, process
    assert srv.admin[1] not in (srv.folder / control.AUTH_CONFIG).read_text()
    # yet the admin logs in: the user store was made with it
    assert call(srv, "GET", f"{API}/users/get", srv.admin, params={"username": "ed"}).ok


def test_a_server_in_a_closed_home_starts_and_sees_nothing_else_of_it(tmp_path):
    """A clone under /root (a GPU container's home): the server's user reaches the checkout's
    environment and the server's folder there, and nothing else of the home."""
    home = Path(tempfile.mkdtemp(dir="/root", prefix="ablate-home-"))
    try:
        secret = home / "secret.txt"
        secret.write_text("the home's own")
        folder = home / "clone" / ".server"
        owner = service_user.service_user()
        command = service_user.as_service(
            ["sh", "-c", f"ls -d {folder.parent} && cat {secret}"], owner, [folder.parent]
        )
        folder.parent.mkdir(parents=True)
        seen = subprocess.run(command, capture_output=True, text=True)
        assert str(folder.parent) in seen.stdout and "the home's own" not in seen.stdout
        assert seen.returncode != 0 and "No such file" in seen.stderr
        port = free_port()
        cli = [*CLI, "--dir", str(folder)]
        started = subprocess.run([*cli, "start", "--port", str(port)], capture_output=True,
                                 text=True, timeout=300)  # fmt: skip
        try:
            assert started.returncode == 0, started.stderr[-3000:]
            admin = read_credentials(folder / control.CREDENTIALS)
            answer = requests.get(f"http://127.0.0.1:{port}{API}/experiments/search",
                                  params={"max_results": 1}, auth=admin, timeout=30)  # fmt: skip
            assert answer.status_code == 200, answer.text
        finally:
            control.stop(folder)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_another_local_user_reads_nothing_of_the_server(srv):
    # every file the server wrote (its store, artifacts, log, user store) is its owner's alone
    for path in srv.folder.rglob("*"):
        mode = path.lstat().st_mode
        if not (stat.S_ISSOCK(mode) or stat.S_ISLNK(mode)):
            assert mode & 0o077 == 0, path
    name = f"ablate-probe{os.getpid() % 100000}"
    subprocess.run(["useradd", "--no-create-home", name], check=True, capture_output=True)
    try:
        targets = [str(p) for p in srv.folder.rglob("*") if p.is_file() and not p.is_symlink()]
        probe = subprocess.run(
            ["runuser", "-u", name, "--", "sh", "-c",
             'for f in "$@"; do cat "$f" >/dev/null 2>&1 && echo "read $f"; done; '
             'ls "$0" >/dev/null 2>&1 && echo "listed $0"; true', str(srv.folder), *targets],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert probe.returncode == 0 and probe.stdout == "", probe.stdout[:2000]
        assert len(targets) > 10  # the store, the user store, the database, the log, ...
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def test_a_taken_database_port_or_a_planted_log_link_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AblateError, match=rf"PostgreSQL's port {port} .* PG_PORT="):
            control.start(tmp_path / "a", free_port(), port, db_url=None)
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / control.LOG).symlink_to(tmp_path / "elsewhere.log")
    with pytest.raises(AblateError, match=f"{control.LOG}.*symlink"):
        control.start(folder, free_port(), 0, db_url=f"sqlite:///{folder}/{control.HOME}/m.db")
    assert not (tmp_path / "elsewhere.log").exists()
    # a sqlite store the server's own user could not write: said before anything starts
    with pytest.raises(AblateError, match=rf"does not own {tmp_path}: .*{control.HOME}/mlflow.db"):
        control.start(tmp_path / "c", free_port(), 0, db_url=f"sqlite:///{tmp_path}/m.db")
    assert not (tmp_path / "c" / control.STATE).exists()


def test_a_cluster_from_an_earlier_ablate_loses_its_superuser_role():
    # as an earlier ablate made it: the server's role is the cluster's first superuser
    folder = Path(tempfile.mkdtemp(prefix="ablate-old-"))
    folder.chmod(0o755)
    data, password = folder / "pg", "legacy-Pass-0192-xyz"
    data.mkdir(mode=0o700)
    shutil.chown(data, "postgres", "postgres")
    (folder / "initpw").write_text(password + "\n")
    subprocess.run(
        ["runuser", "-u", "postgres", "--", postgres.pg_bin("initdb"), "-D", str(data), "-U",
         "ablate", "-A", "scram-sha-256", f"--pwfile={folder / 'initpw'}"],
        check=True, capture_output=True,
    )  # fmt: skip
    (folder / "pgpass").write_text(f"127.0.0.1:*:*:ablate:{password}\n")
    (folder / "pgpass").chmod(0o600)
    port = free_port()
    try:
        postgres.start_postgres(folder, port)
        with psycopg2.connect(host="127.0.0.1", port=port, user="ablate", dbname="postgres",
                              passfile=str(folder / "pgpass")) as db:  # fmt: skip
            cur = db.cursor()
            cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'ablate'")
            assert cur.fetchone() == (False,)
    finally:
        postgres.stop_postgres(str(data))
        shutil.rmtree(folder, ignore_errors=True)


def test_failed_logins_are_limited_per_user_and_address(srv):
    assert call(srv, "POST", f"{API}/users/create", srv.admin,
                json={"username": "victim", "password": STRONG}).status_code == 200  # fmt: skip
    with requests.Session() as one:  # the server's two workers count together
        codes = [
            one.get(f"{srv.uri}{API}/experiments/search", auth=("victim", f"guess-{i}")).status_code
            for i in range(11)
        ]
        assert codes == [401] * 10 + [429]
        right = one.get(f"{srv.uri}{API}/experiments/search", auth=("victim", STRONG))
        assert right.status_code == 429 and "try again later" in right.text
        # the same flood against the admin: its own commands on this machine still manage
        for i in range(11):
            one.get(f"{srv.uri}{API}/experiments/search", auth=("admin", f"guess-{i}"))
        assert one.get(f"{srv.uri}{API}/experiments/search", auth=srv.admin).status_code == 429
    added = subprocess.run(
        [*CLI, "--dir", str(srv.folder), "member", "newcomer", "--role", "reader"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr[-2000:]
    assert members.member_file(srv.folder, "newcomer").is_file()


def test_a_password_sprayer_is_held_back_but_not_the_members_behind_its_address(srv):
    with requests.Session() as one:  # last: this address has sprayed after it
        codes = [
            one.get(
                f"{srv.uri}{API}/experiments/search", auth=(f"u{i}", "a-guess-1234")
            ).status_code
            for i in range(31)
        ]
        assert codes == [401] * 31  # one guess a name, the window's first
        again = one.get(f"{srv.uri}{API}/experiments/search", auth=("u0", "another-guess-1"))
        assert again.status_code == 429  # then a name that failed from here is held back
        # a member who has not failed from this address (an SSH tunnel's 127.0.0.1) gets in
        search = {"max_results": 1}
        answer = one.get(f"{srv.uri}{API}/experiments/search", auth=srv.ed, params=search)
        assert answer.status_code == 200, answer.text
