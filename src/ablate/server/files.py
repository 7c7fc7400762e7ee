"""What ``make server`` keeps in its folder (``.server/``) that the server and its members'
commands both read: the admin's credentials file and the running server's state, its address."""

from __future__ import annotations

import json
from pathlib import Path

from ablate.errors import AblateError

STATE = "server.json"
CREDENTIALS = "credentials"  # the admin's


def local_uri(folder: Path) -> str:
    """The address of the server recorded in ``folder``, from this machine."""
    path = folder.resolve() / STATE
    if not path.is_file():
        raise AblateError(f"no server recorded in {folder}: start it first (make server)")
    state = json.loads(path.read_text())
    host = state.get("host", "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "localhost") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{state['port']}"
