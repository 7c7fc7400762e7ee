"""The credentials files of the team server's admin and members: MLflow's credentials-file
format (copy one to ``~/.mlflow/credentials`` to use it), readable by their owner only, with
passwords generated to pass the server's own rules."""

from __future__ import annotations

import configparser
import secrets
from pathlib import Path

from ablate.errors import AblateError
from ablate.fileio import write_atomic
from ablate.server.passwords import password_problem
from ablate.tracking.auth import ENV_PASSWORD, ENV_USER

_SECTION = "mlflow"


def new_password(username: str = "") -> str:
    """A random password (24 URL-safe characters) that the team server takes for ``username``
    (``ablate.server.passwords.password_problem``: a random one contains the name rarely)."""
    while password_problem(password := secrets.token_urlsafe(18), username):
        pass
    return password


def write_private(path: Path, text: str, owner: tuple[int, int] | None = None) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (0600), atomically;
    ``owner`` (uid, gid) gets the file (set on the open file: a symlink planted at the path is
    replaced, never followed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, 0o600, owner)  # never readable by others


def write_credentials(path: Path, username: str, password: str) -> None:
    """A credentials file in MLflow's format (copy it to ``~/.mlflow/credentials`` to use it)."""
    write_private(
        path,
        f"[{_SECTION}]\n{ENV_USER.lower()} = {username}\n{ENV_PASSWORD.lower()} = {password}\n",
    )


def read_credentials(path: Path) -> tuple[str, str]:
    """(user, password) of a credentials file in MLflow's format."""
    parser = configparser.ConfigParser()
    if not parser.read(path) or _SECTION not in parser:
        raise AblateError(f"{path}: no [{_SECTION}] credentials here")
    section = parser[_SECTION]
    user, password = section.get(ENV_USER.lower()), section.get(ENV_PASSWORD.lower())
    if not user or not password:
        raise AblateError(f"{path}: {ENV_USER.lower()} or {ENV_PASSWORD.lower()} is missing")
    return user, password
