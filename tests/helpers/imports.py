"""What a process tree imports: ``recorder`` writes a ``sitecustomize`` that every Python started
with it on ``PYTHONPATH`` loads (forked workers inherit its audit hook), appending each module
it loads to ``<folder>/<pid>.txt``; ``distributions`` tells which installed distributions hold
them. An audit hook rather than ``sys.modules`` at exit: a sweep's workers leave by
``os._exit``, which runs no exit handler."""

from __future__ import annotations

import os
import re
from importlib.metadata import distributions as installed
from pathlib import Path

from packaging.utils import canonicalize_name

SITECUSTOMIZE = """\
import os, sys

def _record(event, args, _folder={folder!r}):
    if event == "import":
        with open(os.path.join(_folder, f"{{os.getpid()}}.txt"), "a") as f:
            f.write(args[0] + "\\n")

sys.addaudithook(_record)
"""


def recorder(folder: Path) -> dict[str, str]:
    """Environment variables under which each Python process records its imports in
    ``folder/log/`` (``loaded``)."""
    (folder / "log").mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(folder=str(folder / "log")))
    paths = [str(folder), os.environ.get("PYTHONPATH")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def loaded(folder: Path) -> dict[int, set[str]]:
    """Per process id, the modules it loaded."""
    return {int(f.stem): set(f.read_text().split()) for f in (folder / "log").glob("*.txt")}


_SUFFIX = re.compile(r"(/__init__)?(\.cpython-[^/]*\.so|\.abi3\.so|\.so|\.py)$")


def distributions(modules: set[str]) -> dict[str, set[str]]:
    """Installed distribution (canonical name) -> those of ``modules`` whose files it holds;
    modules of no distribution (the standard library, an editable install) are left out."""
    owners: dict[str, set[str]] = {}
    for dist in installed():
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or ():
            path = str(file)
            if not _SUFFIX.search(path) or path.startswith(".."):
                continue
            owners.setdefault(_SUFFIX.sub("", path).replace("/", "."), set()).add(name)
    found: dict[str, set[str]] = {}
    for module in modules:
        for name in owners.get(module, ()):
            found.setdefault(name, set()).add(module)
    return found
