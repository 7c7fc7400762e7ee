"""The report tests' real tiny grid: one ``--multirun`` sweep into a real MLflow store, built once
per test session (tests/conftest.py) and read by every report module; a test that writes to the
store takes a copy (``copy_grid``). Also what those modules read back from it."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from filelock import FileLock
from mlflow.tracking import MlflowClient

from ablate import report
from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs, new_store, sweep_parents

CHART_FILES = [f"{name}.png" for name in report.CHARTS]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def once_per_session(tmp_path_factory, name: str, produce: Callable[[Path], None]) -> Path:
    """The folder ``name``, filled by ``produce(folder)`` once per test session: under
    pytest-xdist the first worker that asks fills it while holding a lock, the others wait and
    read it (a worker that died while filling it leaves no ``.done``: the next one starts over)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder: its workers' folders are inside it
    folder = base / name
    with FileLock(str(base / f"{name}.lock")):
        if not (folder / ".done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            produce(folder)
            (folder / ".done").touch()
    return folder


def build_grid(slice_root: Path, folder: Path) -> None:
    """2 strategies x 2 seeds x 2 epochs (tiny model, Naija slice) in ``folder``, plus one run
    FAILED in training and, after the sweep, a FAILED sweep with no run (as a sweep whose every
    job failed before its run opened, a misspelt treebank, was left by earlier versions)."""
    store = new_store(folder)
    # cwd=folder: nothing of the sweep lands in the checkout
    proc = run_cli(
        "--multirun", "freeze=none,all", "seed=1,2", *slice_overrides(slice_root, store, folder),
        cwd=folder,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("ablate").experiment_id
    # A run that failed in training (errors in the configuration or data leave no run at all):
    # recorded as ablate records one, with the params of the grid's runs.
    sibling = logged_runs(store)[0]
    params = dict(sibling.data.params)
    params.update({"freeze.name": "first2", "freeze.first": "2", "seed": "1"})
    failed = client.create_run(
        exp, run_name="UD_Naija-Slice-first2-tiny-s1",
        tags={"mlflow.parentRunId": sibling.data.tags["mlflow.parentRunId"]},  # one of the sweep's
    ).info  # fmt: skip
    for key, value in params.items():
        client.log_param(failed.run_id, key, value)
    client.set_tag(failed.run_id, "error", "RuntimeError: out of memory (injected)")
    client.set_terminated(failed.run_id, "FAILED")
    typo = client.create_run(
        exp, run_name="sweep data.treebank=UD_Nope",
        tags={"ablate.role": "sweep", "hydra.sweep_dir": str(folder / "typo")},
    ).info.run_id  # fmt: skip
    client.set_terminated(typo, "FAILED")


def grid_of(folder: Path) -> SimpleNamespace:
    """The grid in ``folder`` as the tests read it: its store and folder, its sweep's folder and
    the empty sweep's (as their parent runs record them), a client and the training runs."""
    store = f"sqlite:///{folder / 'mlflow.db'}"
    first, latest = sorted(sweep_parents(store), key=lambda p: p.info.start_time)
    assert latest.info.status == "FAILED" and latest.data.tags["hydra.sweep_dir"].endswith("typo")
    runs = logged_runs(store)
    assert sorted(r.info.status for r in runs) == ["FAILED"] + ["FINISHED"] * 4
    return SimpleNamespace(
        store=store, tmp=folder, client=MlflowClient(store), runs=runs,
        sweep=Path(first.data.tags["hydra.sweep_dir"]),
        typo=Path(latest.data.tags["hydra.sweep_dir"]),
    )  # fmt: skip


def copy_grid(grid: SimpleNamespace, folder: Path) -> SimpleNamespace:
    """A copy of ``grid``'s store and artifacts in ``folder``, for tests that write to it (its
    sweeps' folders stay the grid's: their parent runs record those paths)."""
    shutil.copy2(grid.tmp / "mlflow.db", folder / "mlflow.db")
    shutil.copytree(grid.tmp / "mlartifacts", folder / "mlartifacts")
    # MLflow records absolute artifact URIs and has no API to move a store: point the copy's
    # experiments and runs at its own artifacts, so nothing it logs lands in the shared grid.
    old, new = ((p / "mlartifacts").resolve().as_uri() for p in (grid.tmp, folder))
    with sqlite3.connect(folder / "mlflow.db") as db:
        db.execute(
            "UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
            (old, new),
        )
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (old, new))
    db.close()
    return grid_of(folder)


def report_cli(grid: SimpleNamespace, out: Path) -> str:
    """``python -m ablate.report`` on ``grid``'s store into ``out``, in a real subprocess; its
    console output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.report", "--uri", grid.store, "--out", str(out)],
        cwd=grid.tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def logged(grid) -> dict[str, list]:
    """FINISHED runs by strategy, read with MlflowClient, independently of ablate.report."""
    by = {}
    for r in grid.runs:
        if r.info.status == "FINISHED":
            by.setdefault(r.data.params["freeze.name"], []).append(r)
    return {k: sorted(v, key=lambda r: int(r.data.params["seed"])) for k, v in by.items()}


def epoch_seconds(grid, run) -> float:
    """Time spent in training epochs: the sum of the run's per-epoch ``epoch_time_s``."""
    return sum(m.value for m in grid.client.get_metric_history(run.info.run_id, "epoch_time_s"))


def mean(xs) -> float:
    return float(np.mean(xs))
