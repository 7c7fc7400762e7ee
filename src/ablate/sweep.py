"""The Hydra callback of every run and sweep (``conf/train.yaml``): the store is prepared once
before any job starts; a ``--multirun`` (a grid, an Optuna study) is one MLflow run whose jobs
are its children, and when it ends that parent holds the sweep's report and status, and the
console shows the summary and the command for the full report."""

from __future__ import annotations

import atexit
import json
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ablate.errors import AblateError
from ablate.tracking.signals import pass_on

log = logging.getLogger("ablate")


def _prepare(config: DictConfig) -> str:
    from ablate.tracking.store import prepare

    t = config.tracking
    try:
        return prepare(t.uri, t.experiment, t.stale_after_min)
    except AblateError as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None  # before any job: one line, no traceback


def _sweep_name(config: DictConfig) -> str:
    """``sweep <the overrides that vary or that every job shares>``, without where it goes."""
    from ablate import config as schema

    identity = schema.flags("identity")
    kept = [
        o for o in config.hydra.overrides.task
        if identity.get(o.lstrip("+~").partition("=")[0], True)
    ]  # fmt: skip
    return " ".join(["sweep", *kept])[:250]


class Sweep(Callback):
    """Prepares the store; opens and closes a sweep's parent run."""

    def __init__(self) -> None:
        self.parent: dict[str, Any] | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _prepare(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from mlflow.tracking import MlflowClient

        from ablate.tracking import parent
        from ablate.tracking.run import process

        experiment_id = _prepare(config)
        uri, sweep_dir = config.tracking.uri, str(Path(config.hydra.sweep.dir).resolve())
        client = MlflowClient(uri)
        run = client.create_run(
            experiment_id,
            run_name=_sweep_name(config),
            tags={
                "ablate.role": "sweep",
                "hydra.sweep_dir": sweep_dir,
                "ablate.process": json.dumps(process()),
                "ablate.heartbeat": f"{time.time():.0f}",
                **config.tracking.tags,
            },
        )
        parent.record(sweep_dir, run.info.run_id, uri)
        self.parent = {
            "id": run.info.run_id, "uri": uri, "experiment": config.tracking.experiment,
            "sweep_dir": sweep_dir, "ended": False,
        }  # fmt: skip
        atexit.register(self._end, completed=False)  # a failed or interrupted sweep ends too
        pass_on(self._stopped)  # a stop signal reaches the jobs, then ends the sweep KILLED

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._end(completed=True)

    def _stopped(self, signum: int) -> None:
        self._end(completed=False, stopped_by=signal.Signals(signum).name)

    def _end(self, completed: bool, stopped_by: str | None = None) -> None:
        p = self.parent
        if p is None or p["ended"]:
            return
        p["ended"] = True
        end_sweep(p["id"], p["uri"], p["experiment"], p["sweep_dir"], completed, stopped_by)


def end_sweep(
    run_id: str, uri: str, experiment: str, sweep_dir: str, completed: bool,
    stopped_by: str | None = None,
) -> str:  # fmt: skip
    """Close a sweep's parent run: its status from its children's (KILLED when a signal
    ``stopped_by`` stopped it), the report over them as its artifacts (``report/``), and the
    summary printed with the command for the full report. Returns the status."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    children = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'"
    )
    counts: dict[str, int] = {}
    for child in children:
        counts[child.info.status] = counts.get(child.info.status, 0) + 1
    ok = completed and set(counts) == {"FINISHED"}
    status = "FINISHED" if ok else "KILLED" if stopped_by else "FAILED"
    described = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs"
    if not completed:
        described += f"; stopped by {stopped_by}" if stopped_by else "; did not complete"
    client.set_tag(run_id, "ablate.jobs", described)
    summary = _report(client, run_id, uri, experiment)
    client.set_terminated(run_id, status)
    print(f"\nSweep {status}: {described}. MLflow run {run_id} in {uri} ({experiment}).")
    if summary:
        print(summary)
    print(f'Full report: make report ARGS="--sweep {sweep_dir}"\n')
    return status


def _report(client, run_id: str, uri: str, experiment: str) -> str:
    """The report over a sweep's children, logged as the parent's ``report/``; its tables."""
    from ablate.report import build, load_runs, write
    from ablate.report.render import tables

    try:
        report = build(load_runs(experiment, uri, parent=run_id))
        with tempfile.TemporaryDirectory() as tmp:
            write(report, tmp)
            client.log_artifacts(run_id, tmp, "report")
    except AblateError as exc:
        client.set_tag(run_id, "ablate.report", str(exc)[:5000])
        return ""
    except Exception as exc:  # a failing report must not leave the sweep's run RUNNING
        client.set_tag(run_id, "ablate.report", f"the report failed: {exc!r}"[:5000])
        print(f"warning: the sweep's report failed: {exc!r}", file=sys.stderr)
        return ""
    return tables(report)
