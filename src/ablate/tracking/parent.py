"""A sweep's parent run: the MLflow run a ``--multirun`` opens before its jobs, each job's run its
child (tag ``mlflow.parentRunId``). The parent's id reaches every job, whatever the launcher
(local processes, joblib workers, SLURM nodes), through a file in the sweep's folder. A KILLED
run that a later sweep resumes becomes that sweep's child (``adopt``): the sweep that finished
it compares it with its other jobs, and MLflow's UI shows it there."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

FILE = "mlflow_sweep.json"
# Tag prefix on a sweep's run: ``<REUSED><job number>`` names the FINISHED run that job reused
# (``skip_finished``), one of the sweep's runs as much as its children are.
REUSED = "ablate.reused."
# Tag on a ``python -m ablate.train --multirun``'s run: its grid, ``{"n": <jobs>, "jobs": [the
# overrides each job has of its own]}`` (``jobs`` left out where it would not fit in a tag), so
# that a report can name the jobs that have no run in it.
GRID = "ablate.grid"
# Tag on a run that a later sweep resumed: the sweeps it was a job of before, as a JSON list of
# ``{"sweep": <run id>, "job": <job number>}``, oldest first.
MOVED = "ablate.moved_from"


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


def adopt(client, run) -> None:
    """Make ``run`` (a KILLED run this job resumes) a child of this job's sweep, where it was a
    job of another sweep or of none; the sweep it leaves is recorded (``MOVED``). A job
    requeued into its own sweep (the same parent) changes nothing."""
    new = sweep_parent()
    tags = run.data.tags
    old = tags.get(MLFLOW_PARENT_RUN_ID)
    if new is None or new == old:
        return
    if old is not None:
        moved = [
            *json.loads(tags.get(MOVED, "[]")),
            {"sweep": old, "job": tags.get("hydra.job_num")},
        ]
        client.set_tag(run.info.run_id, MOVED, json.dumps(moved))
    client.set_tag(run.info.run_id, MLFLOW_PARENT_RUN_ID, new)
