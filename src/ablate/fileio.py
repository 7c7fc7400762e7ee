"""File helpers that every layer shares (the data's and the archive's hashes and gzip files; the
journal's, the workers' and the team server's small files). Standard library only, so that
anything may import it without a cycle or a cost."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import zlib
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks (a model or a treebank need not fit
    in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_regular(path: str | Path) -> bytes:
    """The bytes of the plain file ``path``, never read through a symbolic link at its name
    (``OSError``, ELOOP) nor from a FIFO, a device or a socket (``OSError``, without waiting for
    a writer): what a folder from elsewhere (an archive) holds, not what it points to."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{path} is not a plain file")
        return fh.read()


def write_atomic(
    path: Path, text: str, mode: int = 0o666, owner: tuple[int, int] | None = None
) -> None:
    """Write ``text`` to ``path`` whole: into ``.<name>.tmp`` beside it, then renamed over it, so
    a reader (or a process that dies meanwhile) sees the old file or the new one, never half.

    ``mode`` is the file's permission from its creation on (umask applies: 0o600 is never
    readable by others, not even for a moment); ``owner`` (uid, gid) is set on the open file, so
    a symlink planted at the path is replaced, never followed."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # one left by a process that died: O_EXCL would refuse it
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        if owner is not None:
            os.fchown(f.fileno(), *owner)
        f.write(text)
    tmp.replace(path)


def write_gzip(path: str | Path, data: bytes) -> None:
    """Write ``data`` gzip-compressed (level 9) to ``path``, the same bytes for the same data (and
    zlib): no time and no file name in the header, which is a GzipFile's (its OS byte 255 on every
    Python, where ``gzip.compress`` writes zlib's own on 3.11 and 3.12)."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=out, mtime=0) as gz:
        gz.write(data)
    Path(path).write_bytes(out.getvalue())


def read_gzip(path: str | Path) -> bytes:
    """The bytes a gzip file holds; ``ValueError`` saying what is wrong where it is no whole gzip
    stream (not gzip, cut short, or its checksum wrong)."""
    return gunzip(Path(path).read_bytes())


def gunzip(raw: bytes) -> bytes:
    """The bytes the gzip stream ``raw`` holds; ``ValueError`` as ``read_gzip``'s."""
    try:
        if not raw:  # gzip.decompress reads no member at all as empty data
            raise EOFError("the file is empty")
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"not a whole gzip stream ({type(exc).__name__}: {exc})") from exc
