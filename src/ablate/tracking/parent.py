"""A sweep's parent run: the MLflow run a ``--multirun`` opens before its jobs, each job's run its
child (tag ``mlflow.parentRunId``). The parent's id reaches every job, whatever the launcher
(local processes, joblib workers, SLURM nodes), through a file in the sweep's folder."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

FILE = "mlflow_sweep.json"
# Tag prefix on a sweep's run: ``<REUSED><job number>`` names the FINISHED run that job reused
# (``skip_finished``), one of the sweep's runs as much as its children are.
REUSED = "ablate.reused."


def record(sweep_dir: str | Path, run_id: str, uri: str) -> None:
    """Write the parent run's id into the sweep's folder, for its jobs."""
    folder = Path(sweep_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FILE).write_text(json.dumps({"run_id": run_id, "uri": uri}))


def recorded(sweep_dir: str | Path) -> dict | None:
    """The parent run recorded in a sweep's folder: ``{"run_id", "uri"}``, or None."""
    path = Path(sweep_dir) / FILE
    return json.loads(path.read_text()) if path.is_file() else None


def in_multirun() -> bool:
    """True inside a job of a ``--multirun`` sweep."""
    return HydraConfig.initialized() and str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


def sweep_parent() -> str | None:
    """The id of the parent run of this job's sweep, or None outside a sweep."""
    if not in_multirun():
        return None
    found = recorded(HydraConfig.get().sweep.dir)
    return found["run_id"] if found else None
