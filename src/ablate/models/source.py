"""Where a model comes from: a local folder or a hub id, checked in seconds (offline-safe), and
its fingerprint by content. Light: imports neither torch nor transformers."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.data.files import sha256_of
from ablate.errors import AblateError

if TYPE_CHECKING:
    from ablate.config import ModelConfig


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers within ``timeout`` seconds.

    Offline, transformers retries a hub id for ~46 s before failing; this probe (run in a thread,
    since a DNS lookup ignores socket timeouts) lets a bad id fail in seconds instead.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(ok)


def check_source(model: ModelConfig) -> None:
    """Fail in seconds, before any data is read, if the model can't be had."""
    path = model.name_or_path
    looks_local = path.startswith((".", "/", "~")) or os.path.exists(path)
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise AblateError(f"model.name_or_path={path!r}: no such folder")
    if not looks_local and not hub_reachable():
        raise AblateError(
            f"model.name_or_path={path!r} is a hub id, and the Hugging Face hub is not reachable "
            f"(offline?): download the model elsewhere and pass its folder, or use model=minilm"
        )


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack", ".onnx")


def source_fingerprint(model: ModelConfig) -> str:
    """What ``model.name_or_path`` holds, not where: for a local folder, the sha256 of its files
    (weights only when ``model.pretrained``: a random init reads only the config); a hub id as
    given. The same model in another checkout (its own venv path) gives the same fingerprint."""
    folder = Path(model.name_or_path).expanduser()
    if not folder.is_dir():
        return str(model.name_or_path)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and ".git" not in p.parts)
    digest = hashlib.sha256()
    for f in files:
        if model.pretrained or f.suffix not in WEIGHT_FILES:
            digest.update(f"{f.relative_to(folder).as_posix()}\n{sha256_of(f)}\n".encode())
    return digest.hexdigest()
