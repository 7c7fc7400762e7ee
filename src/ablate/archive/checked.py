"""An archive's files, checked whole before anything reads them (``check``): plain files and
folders only, every one listed in ``SHA256SUMS`` under a name inside the archive and matching its
sha256. An archive comes from elsewhere (a colleague, a tarball, a pull request) and is imported
by whoever runs the import, into a store others read: a symbolic link (a file, a folder, the
archive folder itself) or a name that leaves the archive (absolute, ``..``, a backslash) would
have the import upload the importing host's own files, so each is refused, naming it, before
anything is read or imported.

What the import then reads, it reads through ``Files.read``: only files of the checked set, each
read again (never through a link) and checked against its sha256 once more, so a file swapped
after the check is refused too and every byte imported is one the manifest vouches for.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ablate.errors import AblateError
from ablate.fileio import read_regular

INDEX = "archive.json"
MANIFEST = "SHA256SUMS"
# A run's id as MLflow itself accepts one (mlflow.utils.validation): a letter or digit, then
# letters, digits, '_' or '-'. An export writes MLflow's own ids, 32 lowercase hex digits; each
# is one folder, runs/<run id>/, and none can name a path outside it.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,255}")


def not_an_archive(folder: Path, why: str) -> AblateError:
    return AblateError(
        f"{folder} is not an ablate archive ({why}); pass the folder that "
        "`python -m ablate.archive export` wrote"
    )


def damaged(path: Path, why: str) -> AblateError:
    return AblateError(
        f"{path}: {why}: the archive was truncated or edited after export; export it again from "
        "its store, or restore the file (e.g. git checkout of the archive folder)"
    )


def refused(path: Path | str, why: str) -> AblateError:
    """An archive that no export writes: one that reaches outside itself."""
    return AblateError(
        f"{path}: {why}; an archive holds plain files and folders only, every path inside it, "
        "so an import reads nothing else: nothing was imported. Export the archive again from "
        "its store (`python -m ablate.archive export`), and import only an archive you trust"
    )


def _link(path: Path) -> AblateError:
    return refused(path, "a symbolic link (to a file or a folder), which an import would follow")


def inside(name: str) -> bool:
    """Whether ``name``, a path an archive names (its manifest's, a run's file), stays inside
    the archive: relative, in '/'-separated components none of which is empty, '.' or '..', no
    backslash, no NUL."""
    if not name or "\\" in name or "\0" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(read_regular(path)).hexdigest()
    except OSError as exc:
        raise damaged(path, f"not readable as a plain file ({exc})") from exc


def _walk(folder: Path, top: Path, out: list[str]) -> None:
    """The plain files under ``folder`` by name relative to ``top``; a link or anything but a
    plain file or folder (a FIFO, a device, a socket) refused."""
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            path = folder / entry.name
            if entry.is_symlink():
                raise _link(path)
            if entry.is_dir(follow_symlinks=False):
                _walk(path, top, out)
            elif entry.is_file(follow_symlinks=False):
                out.append(path.relative_to(top).as_posix())
            else:
                raise refused(path, "neither a plain file nor a folder")


@dataclass(frozen=True)
class Files:
    """An archive's files as checked (``check``): {name: sha256} of each, ``SHA256SUMS`` aside."""

    folder: Path
    sums: dict[str, str]

    def __contains__(self, name: str) -> bool:
        return name in self.sums

    def under(self, prefix: str) -> list[str]:
        """The names under the folder ``prefix``, relative to it, sorted."""
        start = prefix.rstrip("/") + "/"
        return sorted(n.removeprefix(start) for n in self.sums if n.startswith(start))

    def read(self, name: str) -> bytes:
        """The bytes of the checked file ``name``, read again, never through a link, and
        checked against its sha256 once more (a file swapped since ``check``: ``damaged``)."""
        path = self.folder / name
        if name not in self.sums:
            raise damaged(path, f"not listed in {MANIFEST}")
        try:
            raw = read_regular(path)
        except OSError as exc:
            raise damaged(path, f"not readable as a plain file ({exc})") from exc
        if hashlib.sha256(raw).hexdigest() != self.sums[name]:
            raise damaged(path, f"its sha256 differs from the one in {MANIFEST}")
        return raw


def _listed(folder: Path) -> dict[str, str]:
    """``SHA256SUMS`` as {name: sha256}, each name checked to stay inside the archive."""
    path = folder / MANIFEST
    try:
        text = read_regular(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise damaged(path, f"not readable as UTF-8 text ({exc})") from exc
    listed: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", digest) or not name:
            raise damaged(path, f"line {n} is not '<sha256>  <file>'")
        if not inside(name):
            raise refused(
                path, f"line {n} names {name!r}, not a path inside the archive as an export "
                "writes one (relative, '/'-separated, no '..', '.' or empty part, no backslash)"
            )  # fmt: skip
        if name in listed:
            raise damaged(path, f"line {n} lists {name} a second time")
        listed[name] = digest
    return listed


def check(folder: Path) -> Files:
    """The files of the archive ``folder``, checked whole: no link anywhere (the folder itself
    included), nothing but plain files and folders, every file listed in ``SHA256SUMS`` under a
    name inside the archive, every listed file there, each with its sha256. An ``AblateError``
    naming the path and the fix otherwise; nothing is parsed here."""
    if folder.is_symlink():
        raise refused(
            folder, f"the archive folder is a symbolic link (to {os.path.realpath(folder)}), "
            "which could point elsewhere by the time the import reads it; pass the folder itself"
        )  # fmt: skip
    if not folder.is_dir():
        raise not_an_archive(folder, "no such folder")
    present: list[str] = []
    _walk(folder, folder, present)
    for name in (INDEX, MANIFEST):
        if name not in present:
            raise not_an_archive(folder, f"it has no {name}")
    listed = _listed(folder)
    for name in sorted(set(present) - listed.keys() - {MANIFEST}):
        raise damaged(folder / name, f"not listed in {MANIFEST}")
    for name, digest in sorted(listed.items()):
        file = folder / name
        if name not in present:
            raise damaged(file, f"listed in {MANIFEST} but missing")
        if _sha256(file) != digest:
            raise damaged(file, f"its sha256 differs from the one in {MANIFEST}")
    return Files(folder, listed)
