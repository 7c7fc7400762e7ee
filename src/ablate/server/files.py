"""What ``make server`` keeps in its folder (``.server/``) that the server and its members'
commands both read: the admin's credentials file and the running server's state, its address."""

from __future__ import annotations

import json
from pathlib import Path

from ablate.errors import AblateError

STATE = "server.json"
CREDENTIALS = "credentials"  # the admin's
HOME, AUTH_DB = "mlflow", "basic_auth.db"  # the MLflow server's own folder, its user store


def local_uri(folder: Path) -> str:
    """The address of the server recorded in ``folder``, from this machine."""
    path = folder.resolve() / STATE
    if not path.is_file():
        raise AblateError(f"no server recorded in {folder}: start it first (make server)")
    state = json.loads(path.read_text())
    host = local_host(state.get("host", "127.0.0.1"))
    return f"http://{f'[{host}]' if ':' in host else host}:{state['port']}"


def local_host(host: str) -> str:
    """The address at which this machine reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host
