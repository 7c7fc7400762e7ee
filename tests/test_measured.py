"""benchmarks/measured/: every kept run is cited by its file name where its numbers are
discussed, and the tables the docs show of it are that file rendered. The bench journal
(benchmarks/JOURNAL.md) holds every run; docs/speed.md, the reference, the latest of each bench."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gpu_table
import grid_overhead
import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "benchmarks" / "measured"
SPEED = ROOT / "docs" / "speed.md"
JOURNAL = ROOT / "benchmarks" / "JOURNAL.md"
RUNS = sorted(MEASURED.glob("*.json"))
# where a run may be cited: the docs, the bench journal, the tests, the benchmarks' and the
# package's code (a file citing itself, or its folder listed, is no citation)
CITING = ("README.md", "docs/**/*.md", "benchmarks/*.md", "benchmarks/*.py", "tests/**/*.py",
          "src/**/*.py")  # fmt: skip


def rendered_tables(path: Path) -> list[str]:
    """The markdown tables of a saved run, as its tool renders them."""
    saved = json.loads(path.read_text(encoding="utf-8"))
    overhead = path.name.startswith("cpu-overhead-")  # a grid before and after a change
    text = (grid_overhead.render if overhead else gpu_table.render)(saved)
    return [block.strip() for block in text.split("\n\n") if block.startswith("| ")]


def latest(prefix: str) -> list[str]:
    """The runs named ``<prefix>-<date>...`` of the newest date."""
    dated = {p.name: re.match(rf"{prefix}-(\d{{4}}-\d\d-\d\d)", p.name) for p in RUNS}
    dates = {name: m[1] for name, m in dated.items() if m}
    return sorted(name for name, date in dates.items() if date == max(dates.values()))


def test_every_measured_run_is_cited_by_its_file_name():
    assert RUNS, "benchmarks/measured/ holds no run"
    paths = {p for pattern in CITING for p in ROOT.glob(pattern)}
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(paths))
    uncited = [p.name for p in RUNS if p.name not in text]
    assert uncited == [], f"cite each where its numbers are discussed, or remove it: {uncited}"
    journal = JOURNAL.read_text(encoding="utf-8")
    assert [p.name for p in RUNS if p.name not in journal] == []  # the journal names every run


@pytest.mark.parametrize("doc", [JOURNAL, SPEED], ids=lambda p: p.name)
def test_the_tables_a_doc_shows_of_a_measured_run_are_that_run_rendered(doc):
    text = doc.read_text(encoding="utf-8")
    named = [p for p in RUNS if p.name in text]
    assert named, f"{doc.name} names no measured run"
    for path in named:
        saved = json.loads(path.read_text(encoding="utf-8"))
        measured_on = "NVIDIA" if path.name.startswith("gpu-") else "CPU"  # as each is named
        assert saved["meta"]["device"].startswith(measured_on), path.name
        tables = rendered_tables(path)
        assert tables, path.name
        for block in tables:
            assert block in text, f"{doc.name} lacks {path.name}'s table: run gpu_table.py on it"


def test_the_reference_shows_the_latest_run_of_each_bench_and_no_older_one():
    text = SPEED.read_text(encoding="utf-8")
    shown = [p.name for p in RUNS if p.name in text]
    assert shown == sorted(latest("gpu") + latest("cpu-overhead"))
