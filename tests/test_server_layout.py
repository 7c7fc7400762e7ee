"""The team server sits beside run recording: ``ablate.server`` may import ``ablate.tracking``,
never the reverse, so a run loads nothing of the server."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ablate"


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_run_recording_imports_nothing_of_the_team_server():
    files = sorted((SRC / "tracking").glob("*.py"))
    assert len(files) > 10 and (SRC / "server" / "control.py").is_file()
    upward = {
        f"tracking/{f.name}: {name}"
        for f in files
        for name in imported(f)
        if name == "ablate.server" or name.startswith("ablate.server.")
    }
    assert not upward, "tracking/ must not import ablate.server (the server imports tracking)"
    assert "ablate.tracking.auth" in imported(SRC / "server" / "control.py")
