"""A command run by another user (the server's, PostgreSQL's) that needs paths behind a folder
that user may not pass (a clone under /root, pyenv there): it runs in a mount namespace of its
own, in which a tmpfs hides the closed folder and only those paths are mounted back, so the rest
of that folder stays out of its reach."""

from __future__ import annotations

from pathlib import Path

from ablate.errors import AblateError

# $1: the closed folder; the paths after it, up to "--", mounted back in it (the folders made for
# them passable: umask 022); then exec the rest with the umask it came with ("$@": the next
# closed folder's reveal, or the command as the other user)
_REVEAL = (
    'set -e; u=$(umask); umask 022; c=$1; shift; m=""; '
    'while [ "$1" != "--" ]; do s=$(mktemp -d); mount --bind "$1" "$s"; m="$m $1:$s"; shift; done; '
    'shift; mount -t tmpfs -o mode=0711,size=1m ablate "$c"; '
    'for x in $m; do p=${x%%:*}; s=${x#*:}; mkdir -p "$p"; '
    'mount --move "$s" "$p"; rmdir "$s"; done; umask "$u"; exec "$@"'
)


def closed(path: Path, gid: int) -> Path | None:
    """The first folder above ``path`` that others (and group ``gid``) may not pass through."""
    for parent in reversed(path.parents):
        st = parent.stat()
        if not (st.st_mode & 0o001 or (st.st_gid == gid and st.st_mode & 0o010)):
            return parent
    return None


def revealing(paths: list[tuple[Path, Path]], user: str) -> list[str]:
    """The command prefix that shows ``paths`` ((closed folder, path to show in it)) and
    nothing else of their closed folders; [] when there are none."""
    shown: dict[Path, set[Path]] = {}
    for folder, path in paths:
        if any(c in str(path) for c in (" ", "\t", "\n", ":")):
            raise AblateError(
                f"{path}: {user} cannot reach it ({folder} is closed to other users) and its "
                "name has a space or ':': move it"
            )
        shown.setdefault(folder, set()).add(path)
    prefix: list[str] = []
    for folder in sorted(shown, key=lambda c: len(c.parts)):
        ordered = sorted(shown[folder], key=lambda p: len(p.parts))
        kept = [p for p in ordered if not any(q != p and q in p.parents for q in ordered)]
        prefix += ["sh", "-c", _REVEAL, "sh", str(folder), *map(str, kept), "--"]
    return ["unshare", "--mount", "--propagation", "private", *prefix] if prefix else []


def behind_closed(paths: list[Path], gid: int) -> list[tuple[Path, Path]]:
    """(closed folder, path) of each of ``paths`` that a user of group ``gid`` cannot reach."""
    found = []
    for path in paths:
        if (folder := closed(path, gid)) is not None:
            found.append((folder, path))
    return found
