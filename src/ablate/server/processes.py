"""The team server's processes (the MLflow server, the lr-study storage): started as the
server's own user, in a session of their own, their output in a log of root's."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from ablate.errors import AblateError
from ablate.server.credentials import write_private
from ablate.server.files import AUTH_DB, HOME, STATE, local_host
from ablate.server.postgres import client_env
from ablate.server.service_user import as_service
from ablate.tracking import procs
from ablate.tracking.auth import ENV_PASSWORD, ENV_USER

STUDY_LOG = "lrstudy.log"  # the lr-study storage's (ablate.server.studies)


def service_env(folder: Path) -> dict[str, str]:
    """The environment of the server's processes: the database's password file, no login."""
    hidden = (ENV_USER, ENV_PASSWORD, "MLFLOW_AUTH_ADMIN_PASSWORD")
    env = {k: v for k, v in client_env(folder).items() if k not in hidden}
    return {**env, "MLFLOW_DISABLE_TELEMETRY": "true", "HOME": str(folder / HOME)}


def spawn(
    folder: Path, cmd: list[str], env: dict, owner: tuple[int, int] | None, log_name: str
) -> subprocess.Popen:
    """``cmd`` as the server's user, in its own session, into root's log ``log_name``."""
    # root's file, appended to by the server through this descriptor; a symlink is refused
    path = folder / log_name
    try:
        log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise AblateError(
            f"{path}: cannot open the server's log ({exc.strerror}; a symlink there is "
            f"refused): move it away"
        ) from None
    if owner is not None:
        import ablate

        cmd = as_service(cmd, owner, [Path(sys.prefix), Path(ablate.__file__).parent, folder])
    try:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=folder / HOME,
            umask=0o077,
        )
    finally:
        os.close(log)


def start_studies(
    folder: Path, state: dict, db_url: str, port: int, logins: str, owner: tuple[int, int] | None
) -> None:
    """The lr-study storage (``ablate.server.studies``), on the MLflow server's host and its
    users and failed logins, once it answers on ``port``."""
    host = state.get("host", "127.0.0.1")
    cmd = [
        sys.executable,
        "-m",
        "ablate.server.studies",
        "--db-url",
        db_url,
        "--host",
        host,
        "--port",
        str(port),
        "--users-db",
        str(folder / HOME / AUTH_DB),
        "--logins",
        logins,
    ]
    proc = spawn(folder, cmd, service_env(folder), owner, STUDY_LOG)
    state.update(study_pid=proc.pid, study_started=procs.started(proc.pid), study_port=port)
    write_private(folder / STATE, json.dumps(state))
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((local_host(host), port), 1):
            return
        time.sleep(0.2)
    raise AblateError(
        f"the lr-study storage did not start on port {port}: see {folder / STUDY_LOG}"
    )
