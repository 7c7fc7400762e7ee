"""The import graph of ``src/ablate``: every arrow between its packages and top-level modules
points down the layers below (or stays within one layer without a cycle). Imports inside
functions and under ``TYPE_CHECKING`` count: they are arrows all the same."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from helpers.data import ROOT

SRC = ROOT / "src" / "ablate"
# Top to bottom: a unit (a package, or a module on the ground floor) imports only units of its
# own layer or of layers below it.
LAYERS = [
    {"docs"},  # the generator of the repository's docs: reads everything
    {"train", "sweep", "workers", "cli", "helptext", "server", "archive"},  # entry points
    {"report"},
    {"lrstudy"},
    {"training"},
    {"strategies", "speed", "tracking", "plugins"},
    {"models", "tasks"},
    {"data"},
    {"config", "overrides", "pinned", "switches", "freeze_keys", "extensions", "errors"},
    {"fileio", "quiet", "tables", "paths"},
]


def _unit(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _imported(tree: ast.AST) -> set[str]:
    """The units of ablate that ``tree`` imports, by absolute import."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "ablate":
                names |= {f"ablate.{a.name}" for a in node.names}
            else:
                names.add(node.module)
    return {n.split(".")[1] for n in names if n.startswith("ablate.")}


def _graph() -> dict[str, dict[str, list[str]]]:
    """unit -> unit it imports -> the files that do."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(SRC.rglob("*.py")):
        for target in _imported(ast.parse(path.read_text())) - {_unit(path)}:
            edges[_unit(path)][target].append(str(path.relative_to(ROOT)))
    return edges


def _cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_every_unit_has_its_layer():
    units = {_unit(p) for p in SRC.rglob("*.py")} - {"__init__", "__main__"}
    placed = set().union(*LAYERS)
    assert units - placed == set(), "put each new package or module in a layer of LAYERS"
    assert placed - units == set(), "a unit of LAYERS is gone: take it out"


def test_no_arrow_points_up_and_no_cycle_between_packages():
    layer = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    edges = _graph()
    up = [
        f"{source} -> {target} ({', '.join(files)})"
        for source, targets in sorted(edges.items())
        for target, files in sorted(targets.items())
        if layer.get(target, -1) < layer.get(source, -1)
    ]
    assert up == [], "imports up the layers:\n" + "\n".join(up)
    assert _cycles(edges) == []
