"""Who owns what of the team server's folder (``.server/``), and the user the MLflow server
runs as.

Started as root, the server runs as a system user of its own (``ablate-mlflow``, created once
with ``useradd``): it owns its folders and settings files, and nothing of root's. ``.server/``
stays root's (0711: the server's user and PostgreSQL pass through to their own folders; nobody
else lists or changes it). Started as another user, everything is that user's (0700).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from ablate.errors import AblateError
from ablate.server import namespace
from ablate.server.files import HOME
from ablate.server.postgres import private_dir

SERVICE_USER = "ablate-mlflow"
MEMBERS = "members"


def service_user() -> tuple[int, int] | None:
    """(uid, gid) of the server's own user when we are root (created once), else None: the
    server runs as whoever starts it."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            capture_output=True,
        )  # fmt: skip  (a start beside this one may have created it: looked up again)
        try:
            entry = pwd.getpwnam(SERVICE_USER)
        except KeyError:
            raise AblateError(
                f"could not create the server's user {SERVICE_USER} (useradd): create it "
                f"(useradd --system {SERVICE_USER}) or start the server as another user"
            ) from None
    return entry.pw_uid, entry.pw_gid


def own_folder(folder: Path) -> None:
    """``folder`` ours alone; as root others may pass through (0711) to their own folders in it
    (the server's user, PostgreSQL), never list or change it."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, os.geteuid(), os.getegid())  # an earlier ablate gave it to postgres
        os.fchmod(fd, 0o711 if os.geteuid() == 0 else 0o700)
    finally:
        os.close(fd)
    private_dir(folder / MEMBERS, None)


def adopt(path: Path, owner: tuple[int, int] | None) -> None:
    """``path`` a private folder of the server's user; what an earlier root-run server wrote
    there becomes its own (never following a symlink)."""
    # root's so far (an earlier ablate's server): nobody else could have planted links there
    if owner is not None and path.is_dir() and not path.is_symlink() and path.stat().st_uid == 0:
        for root, dirs, files in os.walk(path):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), *owner, follow_symlinks=False)
                if not os.path.islink(os.path.join(root, name)):
                    os.chmod(os.path.join(root, name), 0o700 if name in dirs else 0o600)
    private_dir(path, owner)


def as_service(cmd: list[str], owner: tuple[int, int], needed: list[Path]) -> list[str]:
    """``cmd`` run as the server's user. Where Python's installation or any of the ``needed``
    paths (the checkout's environment and code, the server's folder) lies behind a folder the
    server's user may not pass (a clone under /root, pyenv there), it runs in a mount namespace
    in which only those paths are visible in that folder (``ablate.server.namespace``)."""
    drop = [
        "setpriv",
        f"--reuid={owner[0]}",
        f"--regid={owner[1]}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]
    python = Path(sys.base_prefix).resolve()
    hidden = namespace.behind_closed([p.resolve() for p in needed], owner[1])
    if (folder := namespace.closed(python / "bin", owner[1])) is not None:
        hidden.append((folder, folder / python.relative_to(folder).parts[0]))
    return [*namespace.revealing(hidden, SERVICE_USER), *drop, *cmd]


def check_sqlite_writable(db_url: str, owner: tuple[int, int] | None, folder: Path) -> None:
    """A sqlite ``db_url`` the server's own user can write (its folder that user's), else one
    line saying where it may go: started as root, the server runs as that user."""
    if owner is None or not db_url.startswith("sqlite:///"):
        return
    path = Path(db_url.removeprefix("sqlite:///"))
    held = path if path.exists() else path.parent
    if not held.exists() or held.stat().st_uid != owner[0]:
        raise AblateError(
            f"--db-url {db_url}: the server runs as its own user ({SERVICE_USER}), which does "
            f"not own {held}: put the file in the server's own folder (sqlite:///"
            f"{folder / HOME}/mlflow.db), or chown -R {SERVICE_USER} {path.parent}"
        )
