"""The Hydra callback of every run and sweep (``conf/train.yaml``): the store is prepared once
before any job starts; a ``--multirun`` (a grid, an Optuna study) is one MLflow run whose jobs
are its children, and when it ends that parent holds the sweep's report and status, and the
console shows the summary and the command for the full report."""

from __future__ import annotations

import atexit
import json
import logging
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ablate import workers
from ablate.errors import AblateError
from ablate.tracking.journal import chunks
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


def _report_imports() -> None:
    """The report's imports, while the jobs run in their workers: the report after the last
    job then starts at once."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # as the report's writer sets it
        import matplotlib.pyplot  # noqa: F401

        import ablate.report  # noqa: F401
    except Exception:  # the report imports them again, and says what failed
        pass


def _sweep_name(config: DictConfig) -> str:
    """``sweep <the overrides that vary, then those every job shares>``, without where it goes:
    what tells sweeps apart first, where the UI's run-name column cuts a long name short."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from ablate import config as schema

    identity = schema.flags("identity")
    kept = [
        o
        for o in config.hydra.overrides.task
        if identity.get(o.lstrip("+~").partition("=")[0], True)
    ]
    try:
        parsed = OverridesParser.create().parse_overrides(kept)
        varies = {o for o, p in zip(kept, parsed, strict=True) if p.is_sweep_override()}
        kept = [o for o in kept if o in varies] + [o for o in kept if o not in varies]
    except HydraException:  # as typed: the sweep says what is wrong with it
        pass
    return " ".join(["sweep", *kept])[:250]


def _is_train(config: DictConfig) -> bool:
    """Whether the sweep is ``python -m ablate.train --multirun`` (not an lr study's)."""
    return config.hydra.job.name == "train" and config.hydra.sweeper._target_.endswith(
        "BasicSweeper"
    )


def _grid(config: DictConfig) -> dict[str, Any] | None:
    """The jobs the sweep will launch, as ``parent.GRID`` records them; None where Hydra's
    grammar needs more than the command line (a ``glob`` of config groups)."""
    # Hydra's own expansion, so that the job numbers are the ones its launcher gives
    from hydra.errors import HydraException
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    from ablate.overrides import sweep_jobs

    try:
        jobs = sweep_jobs(config.hydra.sweeper.get("params"), config.hydra.overrides.task)
    except HydraException:
        return None
    varying = [i for i in range(len(jobs[0]) if jobs else 0) if len({j[i] for j in jobs}) > 1]
    grid: dict[str, Any] = {"n": len(jobs), "jobs": [" ".join(j[i] for i in varying) for j in jobs]}
    return grid if len(json.dumps(grid)) <= MAX_TAG_VAL_LENGTH else {"n": len(jobs)}


class Sweep(Callback):
    """Prepares the store; opens and closes a sweep's parent run."""

    def __init__(self) -> None:
        self.parent: dict[str, Any] | None = None
        self.preloaded = False  # the sweep's workers, started by the sweep (ablate.workers)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _prepare(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if (num := OmegaConf.select(config, "hydra.job.num")) is not None:
            workers.note_job(num)  # in a preloaded worker: it says which jobs it ran

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from ablate.lrstudy.first import refuse_unstudied

        # first: the workers (hydra/launcher=workers) fork before this process opens the store
        try:
            if _is_train(config):
                refuse_unstudied(config)  # every job's lr study, before any job or record
            self.preloaded = workers.start(config)
        except AblateError as exc:  # a launcher key out of range, studies to run: one line
            print(f"ablate: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        from mlflow.tracking import MlflowClient

        from ablate.tracking import parent
        from ablate.tracking.run import process

        try:
            experiment_id = _prepare(config)
        except SystemExit:
            workers.release()
            raise
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
        if _is_train(config) and (grid := _grid(config)) is not None:
            client.set_tag(run.info.run_id, parent.GRID, json.dumps(grid))
        self.parent = {
            "id": run.info.run_id,
            "uri": uri,
            "experiment": config.tracking.experiment,
            "sweep_dir": sweep_dir,
            "ended": False,
            "overrides": list(config.hydra.overrides.task) if _is_train(config) else None,
        }
        atexit.register(self._end, completed=False)  # a failed or interrupted sweep ends too
        pass_on(self._stopped)  # a stop signal reaches the jobs, then ends the sweep KILLED
        if self.preloaded:  # this process only waits for the jobs from here on
            threading.Thread(target=_report_imports, name="ablate-report", daemon=True).start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        workers.release()  # the workers exit while the report is written
        self._end(completed=True)

    def _stopped(self, signum: int) -> None:
        self._end(completed=False, stopped_by=signal.Signals(signum).name)

    def _end(self, completed: bool, stopped_by: str | None = None) -> None:
        p = self.parent
        if p is None or p["ended"]:
            return
        p["ended"] = True
        end_sweep(
            p["id"],
            p["uri"],
            p["experiment"],
            p["sweep_dir"],
            completed,
            stopped_by,
            p["overrides"],
        )


def end_sweep(
    run_id: str,
    uri: str,
    experiment: str,
    sweep_dir: str,
    completed: bool,
    stopped_by: str | None = None,
    overrides: list[str] | None = None,
) -> str:
    """Close a sweep's parent run: its status from its runs' (its children and the FINISHED runs
    its skipped jobs reused; KILLED when a signal ``stopped_by`` stopped it), the params its runs
    share, a metric per strategy (the seeds' mean), the summary as its description and the report
    as its artifacts (``report/``); the summary printed with the command for the full report.
    A sweep that recorded no run at all is deleted: an empty run would pass for the latest
    sweep. ``overrides``: the sweep's command line, to print the command that continues it.
    Returns the status."""
    from mlflow.tracking import MlflowClient

    from ablate.report.scope import unrun
    from ablate.tracking.parent import GRID, MOVED, REUSED
    from ablate.tracking.run import LIVENESS

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    children = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'"
    )
    this = client.get_run(run_id)
    tags = this.data.tags
    reused = [r for k, v in tags.items() if k.startswith(REUSED) and (r := _alive(client, v))]
    runs = children + reused
    if not runs:
        client.delete_run(run_id)
        print(f"\nSweep ended with no run recorded; its empty MLflow run {run_id} is deleted.")
        return "DELETED"
    counts: dict[str, int] = {}
    for child in children:
        counts[child.info.status] = counts.get(child.info.status, 0) + 1
    ok = completed and set(counts) <= {"FINISHED"}
    killed = stopped_by or (not completed and "KILLED" in counts)
    status = "FINISHED" if ok else "KILLED" if killed else "FAILED"
    parts = [", ".join(f"{n} {s}" for s, n in sorted(counts.items()))] if counts else []
    if resumed := sum(MOVED in c.data.tags for c in children):
        parts[0] += f" ({resumed} resumed from an earlier sweep)"
    parts += [f"{len(reused)} FINISHED earlier (reused)"] if reused else []
    if missing := unrun([this, *children], [run_id]):
        jobs = json.loads(tags[GRID])["n"]
        parts += [f"{len(missing)} of its {jobs} jobs without a run"]
    described = ", ".join(parts)
    if not completed:
        described += f"; stopped by {stopped_by}" if stopped_by else "; did not complete"
    client.set_tag(run_id, "ablate.jobs", described)
    _shared_params(client, run_id, runs)
    summary = _report(client, run_id, uri, experiment, reused)
    for key in LIVENESS:  # only a RUNNING run needs them
        if key in tags:
            client.delete_tag(run_id, key)
    client.set_terminated(run_id, status)
    print(f"\nSweep {status}: {described}. MLflow run {run_id} in {uri} ({experiment}).")
    if summary:
        print(summary)
    print(f'Full report: make report ARGS="--sweep {sweep_dir}"')
    if status != "FINISHED" and overrides is not None:
        again = [a for a in ("skip_finished=true", "trainer.resume=true") if a not in overrides]
        line = shlex.join(["python", "-m", "ablate.train", "--multirun", *overrides, *again])
        print(f"Continue it (finished jobs are skipped, killed ones resumed): {line}")
    print()
    return status


def _alive(client, run_id: str):
    """The run ``run_id``, or None where it was deleted since (or is gone from the store)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    return run if run.info.lifecycle_stage != "deleted" else None


def _shared_params(client, run_id: str, runs: list) -> None:
    """The params every run of the sweep logged with one value: the grid's common settings."""
    from mlflow.entities import Param

    from ablate.tracking.params import shared

    for chunk in chunks(sorted(shared(runs).items())):
        client.log_batch(run_id, params=[Param(k, v) for k, v in chunk])


_METRIC_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- ]+")  # what an MLflow metric name may not hold


def _summary_metrics(client, run_id: str, summary) -> None:
    """A metric per strategy, the seeds' mean (``dev_accuracy/none``; with several panels,
    ``dev_accuracy/<panel>/none``), on the sweep's run, as fractions like its runs' metrics."""
    from mlflow.entities import Metric

    several = summary.panel.nunique() > 1
    now, metrics = int(time.time() * 1000), []
    for row in summary.itertuples():
        where = f"{_METRIC_UNSAFE.sub('_', row.panel)}/" if several else ""
        for split in ("dev", "test"):
            value = getattr(row, f"{split}_mean_pct")
            if value == value:  # not NaN
                name = f"{split}_{row.metric}/{where}{row.strategy}"
                metrics.append(Metric(name, value / 100, now, 0))
    if metrics:
        client.log_batch(run_id, metrics=metrics)


def _report(client, run_id: str, uri: str, experiment: str, reused: list) -> str:
    """The report over a sweep's runs, logged as the parent's ``report/``, its metrics and
    description (with a link to each run it ``reused``: MLflow's page lists only the children);
    returns its tables."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    from ablate.report import build, load_runs, write
    from ablate.report.render import tables

    try:
        report = build(load_runs(experiment, uri, parent=run_id))
        with tempfile.TemporaryDirectory() as tmp:
            write(report, tmp)
            client.log_artifacts(run_id, tmp, "report")
        text = tables(report)
        _summary_metrics(client, run_id, report.summary)
        note = f"{tables(report, short=True)}\nEvery column, the charts and the runs left out: "
        note += "Artifacts, report/summary.md."
        if reused:
            links = ", ".join(
                f"[{r.info.run_name}](#/experiments/{r.info.experiment_id}/runs/{r.info.run_id})"
                for r in reused
            )
            note += f"\n\nReused, FINISHED earlier (skip_finished), not children: {links}."
        client.set_tag(run_id, MLFLOW_RUN_NOTE, note)
    except AblateError as exc:
        client.set_tag(run_id, "ablate.report", str(exc)[:5000])
        return ""
    except Exception as exc:  # a failing report must not leave the sweep's run RUNNING
        client.set_tag(run_id, "ablate.report", f"the report failed: {exc!r}"[:5000])
        print(f"warning: the sweep's report failed: {exc!r}", file=sys.stderr)
        return ""
    return text
