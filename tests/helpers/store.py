"""What a test reads back from a real MLflow store: runs, sweeps' parents, logged files."""

from __future__ import annotations

import functools
import json
import sqlite3
import tempfile
from pathlib import Path

from mlflow.tracking import MlflowClient

from ablate.tracking.store import schema_lock


@functools.cache
def _template() -> sqlite3.Connection:
    """An empty MLflow store, its schema migrated once per test process: MLflow migrates each new
    sqlite file through its whole history, seconds of CPU that every test's new store paid."""
    path = Path(tempfile.mkdtemp(prefix="ablate-template-")) / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    db = sqlite3.connect(path)
    with db:  # MLflow makes its Default experiment again where a copy is opened
        db.execute("DELETE FROM experiment_tags")
        db.execute("DELETE FROM experiments")
    return db


def new_store(folder: Path, name: str = "mlflow.db") -> str:
    """The URI of a new, empty sqlite store ``folder/name``, its schema made as MLflow makes it
    (a copy of ``_template``'s)."""
    folder.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(folder / name) as copy:
        _template().backup(copy)
    copy.close()
    return f"sqlite:///{folder / name}"


def logged_runs(store: str, experiment: str = "ablate", sweeps: bool = False) -> list:
    """Every training run of ``experiment`` in the MLflow store ``store`` (with ``sweeps``, the
    sweeps' parent runs too), read with MlflowClient."""
    with schema_lock(store):  # a process beside may be creating this store's schema
        client = MlflowClient(store)
        found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    return [r for r in runs if sweeps or r.data.tags.get("ablate.role") != "sweep"]


def sweep_parents(store: str, experiment: str = "ablate") -> list:
    """The sweeps' parent runs of ``experiment``."""
    return [r for r in logged_runs(store, experiment, sweeps=True)
            if r.data.tags.get("ablate.role") == "sweep"]  # fmt: skip


def run_info(store: str, run_id: str) -> dict:
    """A run's ``run.json``: its environment, data files and what each speed plugin applied."""
    path = MlflowClient(store).download_artifacts(run_id, "run.json", tempfile.mkdtemp())
    return json.loads(Path(path).read_text())


def logged(store: str, run_id: str, tmp_path: Path, path: str):
    """A JSON artifact ``path`` of run ``run_id``, downloaded into ``tmp_path`` and parsed."""
    local = MlflowClient(store).download_artifacts(run_id, path, str(tmp_path))
    return json.loads(Path(local).read_text())
