"""A team tracking server: ``mlflow server`` with authentication on a PostgreSQL backend,
started and stopped by pid.

``python -m ablate.server start`` creates (once) a PostgreSQL cluster under
``.server/pg`` that asks for a password (``ablate.server.postgres``) — or uses ``--db-url``
for an existing database — and starts MLflow's basic-auth app with ablate's guards
(``ablate.server.app``) on it, with an artifact root under ``.server/artifacts``. On the
first start it generates the admin's password into ``.server/credentials`` (owner-only, MLflow's
credentials-file format; never printed). ``member`` adds a member (reader or editor) or changes
its role, ``password`` gives one a new password (``ablate.server.members``), ``stop`` stops
what ``start`` started, by the pids it recorded.

Started as root, the MLflow server runs as a system user of its own (``ablate-mlflow``, created
once), which owns only what it writes: ``.server/mlflow`` (its user store, ``basic_auth.db``),
``.server/artifacts`` and its two settings files (``basic_auth.ini``, ``pgpass``); the admin's
and the members' credentials stay root's. Everything the server writes is its owner's alone
(umask 077); logs are opened without following symlinks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ablate.config import project_root
from ablate.errors import AblateError
from ablate.server import local_admin
from ablate.server.app import (
    APP_NAME,
    DEFAULT_MAX_UPLOAD_MB,
    LOGINS_ENV,
    MAX_UPLOAD_ENV,
    SECRET_FILE_ENV,
    SECRET_IN_FILE,
    STUDY_PORT_ENV,
)
from ablate.server.credentials import (
    new_password,
    read_credentials,
    write_credentials,
    write_private,
)
from ablate.server.files import AUTH_DB, CREDENTIALS, HOME, STATE, local_uri
from ablate.server.postgres import start_postgres, stop_postgres, study_url
from ablate.server.processes import service_env, spawn, start_studies
from ablate.server.service_user import (
    adopt,
    check_sqlite_writable,
    own_folder,
    service_user,
)
from ablate.server.ui import NO_JOBS, QUIET
from ablate.tracking import procs
from ablate.tracking.auth import as_user, check_server, health

ADMIN = "admin"
# MLflow's AI Gateway keeps provider keys and sends requests from the server's host to any address
# an endpoint names, and any member may create one, a reader too: off on a team server.
NO_GATEWAY = {"MLFLOW_ENABLE_AI_GATEWAY": "false"}
AUTH_CONFIG, SECRET = "basic_auth.ini", "flask_secret"
ARTIFACTS, LOG = "artifacts", "mlflow.log"  # the server's artifact store, its log
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# A password check costs the server ~0.1 s of CPU (scrypt); a worker remembers a good one this
# long, so a password changed or a member removed is refused by every worker within a minute.
AUTH_CACHE_S = 60


def wait_healthy(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``url``/health answers OK; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AblateError(f"mlflow server exited with code {proc.returncode}")
        if health(url) == 200:
            return
        time.sleep(0.5)
    raise AblateError(f"mlflow server at {url} not healthy after {timeout:.0f} s")


def start(
    folder: Path,
    port: int,
    pg_port: int,
    db_url: str | None,
    timeout: float = 120,
    *,
    host: str = "127.0.0.1",
    auth: bool = False,
    allowed_hosts: tuple[str, ...] = (),
    max_upload_mb: int = DEFAULT_MAX_UPLOAD_MB,
    study_port: int = 0,
) -> str:
    """Start PostgreSQL (unless ``db_url``; on ``pg_port``, 0: a free one), the MLflow server
    and, on PostgreSQL's cluster with ``auth``, the lr-study storage (on ``study_port``, 0: a
    free one); return the tracking URI.

    ``auth``: MLflow's basic-auth app with ablate's guards (``make server`` always asks for it);
    without it the server is open to whoever reaches the port, so it must stay on loopback.
    """
    folder = folder.resolve()
    if host not in LOOPBACK and not auth:
        raise AblateError(f"host {host}: a server beyond 127.0.0.1 needs authentication")
    owner = service_user()
    own_folder(folder)
    if (folder / STATE).is_file():
        raise AblateError(f"{folder / STATE}: a server is already recorded; stop it first")
    _check_port_free(host, port)
    if db_url is None:
        pg_port = pg_port or _free_port()
        _check_port_free("127.0.0.1", pg_port, "PostgreSQL's", "make server PG_PORT=...")
        if auth:  # members elsewhere reach their lr studies there (ablate.server.studies)
            study_port = study_port or _free_port(host)
            fix = "make server STUDY_PORT=..."
            _check_port_free(host, study_port, "the lr-study storage's", fix)
    for name in (HOME, ARTIFACTS):
        adopt(folder / name, owner)
    if db_url is not None:
        check_sqlite_writable(db_url, owner, folder)
    env = _auth_env(folder, owner) if auth else {}
    state: dict = {"port": port, "host": host, "auth": auth}
    if db_url is None:
        db_url = start_postgres(folder, pg_port, owner)
        state["pg_data"] = str(folder / "pg")
        state["pg_port"] = pg_port
        write_private(folder / STATE, json.dumps(state))  # stop() can stop it, whatever follows
    env[MAX_UPLOAD_ENV] = str(max_upload_mb)
    env[LOGINS_ENV] = str(folder / HOME / "logins.db")
    if auth:  # the admin's local commands pass the failed-login limit (ablate.server.logins)
        env[local_admin.DIGEST_ENV] = str(local_admin.prepare(folder, owner))
    if "pg_port" in state and auth:
        env[STUDY_PORT_ENV] = str(study_port)
    try:
        uri = _start_mlflow(folder, port, db_url, state, timeout, env, allowed_hosts, owner)
        if auth:  # the server answers: its user store holds the admin
            write_auth_config(folder, owner, None)
        if STUDY_PORT_ENV in env:
            start_studies(
                folder, state, study_url(state["pg_port"]), study_port, env[LOGINS_ENV], owner
            )
        return uri
    except BaseException:
        stop(folder)
        raise


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _auth_env(folder: Path, owner: tuple[int, int] | None) -> dict[str, str]:
    """The basic-auth app's settings (``folder``/basic_auth.ini, the server's to read, which
    holds the admin's password from ``folder``/credentials only while the user store is new)
    and what the server's environment names."""
    try:
        import flask_wtf  # noqa: F401  (MLflow's auth extra)
    except ImportError:
        raise AblateError(
            "MLflow's authentication needs its extra: pip install 'mlflow[auth]'"
        ) from None
    from importlib.metadata import entry_points

    if not entry_points(group="mlflow.app", name=APP_NAME):
        raise AblateError(f"MLflow's app {APP_NAME!r} is not installed: run make setup")
    user_db = folder / HOME / AUTH_DB
    if (folder / AUTH_DB).is_file() and not user_db.exists():  # where an earlier ablate kept it
        os.replace(folder / AUTH_DB, user_db)
    if user_db.is_file() and owner is not None:
        os.chown(user_db, *owner, follow_symlinks=False)
    creds = folder / CREDENTIALS
    if not creds.is_file():
        if user_db.is_file():
            raise AblateError(
                f"{creds} is missing but {user_db} holds the admin user: restore the "
                f"file, or move {user_db} away (its members go with it)"
            )
        write_credentials(creds, ADMIN, new_password(ADMIN))
    if not (folder / SECRET).is_file():
        write_private(folder / SECRET, secrets.token_hex(32))
    user, password = read_credentials(creds)
    # the admin's password only while the user store is new, and in the config file (rewritten
    # without it once the server answers, in ``start``), never in the environment
    # of the long-lived server process, where its user could read it all its life
    write_auth_config(folder, owner, None if user_db.exists() else password)
    return {
        "MLFLOW_AUTH_CONFIG_PATH": str(folder / AUTH_CONFIG),
        "MLFLOW_AUTH_ADMIN_USERNAME": user,
        # the key itself only in a file of the server's: its workers read it (ablate.server.app)
        "MLFLOW_FLASK_SERVER_SECRET_KEY": SECRET_IN_FILE,
        SECRET_FILE_ENV: str(_secret_copy(folder, owner)),
    }


def _secret_copy(folder: Path, owner: tuple[int, int] | None) -> Path:
    """The Flask secret (root's, ``folder``/flask_secret) copied where the server's user reads
    it, in its own folder."""
    copy = folder / HOME / SECRET
    write_private(copy, (folder / SECRET).read_text().strip(), owner)
    return copy


def write_auth_config(folder: Path, owner: tuple[int, int] | None, password: str | None) -> None:
    """``folder``/basic_auth.ini, the basic-auth app's settings: a member sees only the
    experiments granted to it (``ablate.server.members``); with ``password``, the admin's, which
    MLflow reads when it creates the user store."""
    user_db = folder / HOME / AUTH_DB
    admin = f"admin_password = {password}\n" if password else ""
    write_private(
        folder / AUTH_CONFIG,
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{user_db}\nadmin_username = {ADMIN}\n{admin}"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_S}\n",
        owner,
    )


def allowed_host_patterns(host: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The Host headers the server accepts: MLflow's own (loopback and private addresses), and
    beyond loopback this machine's names and ``extra`` (e.g. a reverse proxy's name)."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    names = {host, socket.gethostname(), socket.getfqdn(), *extra} - {"0.0.0.0", "::"}
    return [*get_default_allowed_hosts(), *sorted(n for name in names for n in (name, f"{name}:*"))]


def _start_mlflow(
    folder: Path,
    port: int,
    db_url: str,
    state: dict,
    timeout: float,
    auth_env: dict[str, str],
    allowed_hosts: tuple[str, ...] = (),
    owner: tuple[int, int] | None = None,
) -> str:
    host = state.get("host", "127.0.0.1")
    env = {**NO_JOBS, **NO_GATEWAY, **QUIET, **service_env(folder), **auth_env}
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        db_url,
        "--artifacts-destination",
        str(folder / ARTIFACTS),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "2",
    ]
    if "MLFLOW_AUTH_CONFIG_PATH" in auth_env:
        cmd += ["--app-name", APP_NAME]
    if host not in LOOPBACK:
        cmd += ["--allowed-hosts", ",".join(allowed_host_patterns(host, allowed_hosts))]
    proc = spawn(folder, cmd, env, owner, LOG)
    state["mlflow_pid"] = proc.pid
    state["mlflow_started"] = procs.started(proc.pid)
    write_private(folder / STATE, json.dumps(state))
    uri = local_uri(folder)
    wait_healthy(uri, timeout, proc)
    if proc.poll() is not None:  # something else answered on the port
        raise AblateError(f"mlflow server exited with code {proc.returncode}")
    if "MLFLOW_AUTH_CONFIG_PATH" in auth_env:  # the admin's file matches the user store
        # (a restored backup may not)
        with as_user(*read_credentials(folder / CREDENTIALS)), local_admin.local_admin(folder):
            check_server(uri)
    return uri


def _check_port_free(
    host: str, port: int, whose: str = "", fix: str = "--port (make server PORT=...)"
) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as the server binds: a port left in TIME_WAIT is free, a listening one is not
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            also = "" if whose else "; `make ui` uses it too?"
            raise AblateError(
                f"{whose + ' ' if whose else ''}port {port} on {host} is taken "
                f"({exc.strerror}{also}): choose another with {fix}"
            ) from None


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone meanwhile
        os.killpg(pid, sig)


def _stop_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):  # a polite stop first, up to 10 s each
        _signal_group(pid, sig)  # a server and its workers share its session
        deadline = time.monotonic() + 10
        while procs.alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not procs.alive(pid):
            return


def stop(folder: Path) -> None:
    """Stop the MLflow server, the lr-study storage and the PostgreSQL cluster recorded in
    ``folder``.

    A server is signalled only if its pid still belongs to the process that ``start`` started
    (same start time); a pid reused by another process is left alone.
    """
    path = folder.resolve() / STATE
    if not path.is_file():
        return
    state = json.loads(path.read_text())
    try:
        for name in ("study", "mlflow"):
            pid = state.get(f"{name}_pid")
            if pid and procs.same(pid, state.get(f"{name}_started")):
                _stop_group(pid)
        if state.get("pg_data"):
            stop_postgres(state["pg_data"])
    finally:
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m ablate.server``: start, stop, a member, a new password."""
    from ablate.server import members

    parser = argparse.ArgumentParser(
        prog="python -m ablate.server",
        description="Team MLflow tracking server with authentication, on PostgreSQL.",
    )
    parser.add_argument("--dir", type=Path, default=project_root() / ".server")
    sub = parser.add_subparsers(dest="action", required=True)
    begin = sub.add_parser("start", help="start the server (and its database)")
    begin.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all)")
    begin.add_argument("--port", type=int, default=5000, help="MLflow server port")
    begin.add_argument("--pg-port", type=int, default=0, help="PostgreSQL's port (0: a free one)")
    begin.add_argument(
        "--max-upload-mb",
        type=int,
        default=DEFAULT_MAX_UPLOAD_MB,
        help="largest upload (an artifact) the server takes, in MB",
    )
    begin.add_argument("--db-url", default=None, help="existing database (SQLAlchemy URL)")
    begin.add_argument(
        "--study-port", type=int, default=0, help="the lr-study storage's port (0: a free one)"
    )
    begin.add_argument("--allowed-hosts", default="", help="more names clients use, a,b")
    sub.add_parser("stop", help="stop what start started")
    member = sub.add_parser("member", help="add a member, or change its role")
    member.add_argument("name")
    member.add_argument("--role", required=True, choices=sorted(members.ROLES))
    member.add_argument("--experiments", default="", help="only these experiments, a,b")
    renew = sub.add_parser("password", help="a new password for a member (or the admin)")
    renew.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            extra = tuple(h for h in args.allowed_hosts.split(",") if h)
            uri = start(
                args.dir,
                args.port,
                args.pg_port,
                args.db_url,
                host=args.host,
                auth=True,
                allowed_hosts=extra,
                max_upload_mb=args.max_upload_mb,
                study_port=args.study_port,
            )
            shown = uri if args.host in LOOPBACK else f"http://<this host>:{args.port}"
            print(f"MLflow server at {shown} with authentication (logs in {args.dir});")
            print(f"  the admin's password is in {args.dir / CREDENTIALS} (MLflow's format)")
            print("  add a member: make member NAME=alice ROLE=reader|editor; members use it with:")
            print(f"  export MLFLOW_TRACKING_URI={shown}    # or tracking.uri=...")
        elif args.action == "stop":
            stop(args.dir)
            print(f"stopped the server recorded in {args.dir}")
        else:
            print(members.main(args))
    except AblateError as exc:
        print(f"ablate.server: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
