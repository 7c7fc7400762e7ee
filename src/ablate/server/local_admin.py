"""The admin's commands on the server's own machine (``make member``, ``make password``): their
requests carry a key that only root reads (``.server/local_key``), whose sha256 alone the
server's user holds (``.server/mlflow/local_key.sha256``), so the failed-login limit never
blocks them (``ablate.server.logins``): wrong passwords sent for ``admin`` by anyone cannot keep
its owner from managing the team. Sent through MLflow's own request-header providers, so every
MLflow client call in the block carries it."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from ablate.server.credentials import write_private
from ablate.server.files import HOME

KEY, DIGEST = "local_key", "local_key.sha256"
HEADER = "X-Ablate-Local-Admin"
DIGEST_ENV = "ABLATE_SERVER_LOCAL_DIGEST"  # where the server reads the digest (a path)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def prepare(folder: Path, owner: tuple[int, int] | None) -> Path:
    """The key (made once, root's alone) and its digest in the server's folder; the digest's
    path."""
    key = folder / KEY
    if not key.is_file():
        write_private(key, secrets.token_urlsafe(32))
    digest = folder / HOME / DIGEST
    write_private(digest, _digest(key.read_text().strip()), owner)
    return digest


def matches(value: bytes | None, digest_path: str | None) -> bool:
    """Whether a request's ``HEADER`` value is the key whose digest is at ``digest_path``."""
    if not value or not digest_path or not os.path.isfile(digest_path):
        return False
    with open(digest_path) as f:
        want = f.read().strip()
    return hmac.compare_digest(_digest(value.decode(errors="replace")), want)


_key: list[str] = []  # the key the calls of a ``local_admin`` block carry
_registered: list[bool] = []


@contextlib.contextmanager
def local_admin(folder: Path) -> Iterator[None]:
    """MLflow's client calls in this process carry the admin's local key inside the block."""
    from mlflow.tracking.request_header.abstract_request_header_provider import (
        RequestHeaderProvider,
    )
    from mlflow.tracking.request_header.registry import _request_header_provider_registry

    class LocalAdmin(RequestHeaderProvider):
        def in_context(self) -> bool:
            return bool(_key)

        def request_headers(self) -> dict[str, str]:
            return {HEADER: _key[-1]}

    if not _registered:  # MLflow's registry of header providers: once per process
        _request_header_provider_registry.register(LocalAdmin)
        _registered.append(True)
    path = folder / KEY
    if not path.is_file():
        yield
        return
    _key.append(path.read_text().strip())
    try:
        yield
    finally:
        _key.pop()
