"""``python -m ablate.archive import``: an archive's runs into an MLflow store, each run once.

MLflow gives every new run an id of its own, so a run keeps who it is by its tags: its
``ablate.identity`` (what ``skip_finished`` and ``trainer.resume`` match) as it was, and its id in
the store it was exported from as ``ablate.archive.run_id``, by which a second import finds it
and adds nothing. Tags that name another run (a sweep's parent, the runs a sweep reused, the lr
study's trial a run took its lr from) are pointed at that run's new id. Everything is checked
before the first write; a failure while writing deletes the runs created so far.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ablate.archive import (
    IDENTITY_TAG,
    MOVED_TAG,
    ORIGIN_TAG,
    PARENT_TAG,
    REFERENCE_PREFIXES,
    Archive,
    ArchivedRun,
)
from ablate.config import TUNED_TAG
from ablate.errors import AblateError
from ablate.report.load import MlflowClient, MlflowException
from ablate.tracking.journal import chunks
from ablate.tracking.store import all_runs

# MLflow's log_batch limits per request
_METRICS_PER_BATCH = 1000  # MLflow's limit of metric points per batch (params, tags: chunks')


@dataclass
class Plan:
    """What an import does: the runs the store holds already (archive id -> store id) and the
    runs it creates."""

    uri: str
    held: dict[str, str] = field(default_factory=dict)
    create: list[ArchivedRun] = field(default_factory=list)


def _is_new_sqlite(uri: str) -> bool:
    return uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()


def plan(archive: Archive, uri: str) -> Plan:
    """Check the store at ``uri`` against ``archive`` without writing: which runs it holds
    already, and an ``AblateError`` where it holds a different FINISHED run of the same identity
    (``skip_finished`` and the report would take one for the other)."""
    out = Plan(uri)
    if _is_new_sqlite(uri):  # nothing to read: reading would create the file
        out.create = list(archive.runs)
        return out
    if uri.startswith(("http://", "https://")):
        from ablate.tracking.store import check_reachable

        check_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    by_alias: dict[tuple[str, str], str] = {}
    finished: dict[tuple[str, str], object] = {}
    try:
        for name in sorted({r.info["experiment"] for r in archive.runs}):
            exp = client.get_experiment_by_name(name)
            if exp is None:
                continue
            if exp.lifecycle_stage == "deleted":
                raise AblateError(
                    f"MLflow experiment {name!r} in {uri} is deleted; restore it (mlflow "
                    f"experiments restore --experiment-id {exp.experiment_id}) or import into "
                    "another store (--uri)"
                )
            for run in all_runs(client, exp.experiment_id):
                tags = run.data.tags
                for alias in (run.info.run_id, tags.get(ORIGIN_TAG)):
                    if alias:
                        by_alias[(name, alias)] = run.info.run_id
                if run.info.status == "FINISHED" and IDENTITY_TAG in tags:
                    finished.setdefault((name, tags[IDENTITY_TAG]), run)
    except MlflowException as exc:
        raise AblateError(
            f"{uri}: the MLflow store is not readable ({exc}); pass another with --uri"
        ) from exc
    for run in archive.runs:
        name = run.info["experiment"]
        there = next(
            (by_alias[(name, a)] for a in sorted(run.aliases) if (name, a) in by_alias), None
        )
        if there is not None:
            out.held[run.run_id] = there
            continue
        ident = run.tags.get(IDENTITY_TAG)
        other = finished.get((name, ident)) if run.info["status"] == "FINISHED" else None
        if other is not None:
            raise AblateError(
                f"{run.folder}: {run.describe()} has identity {ident[:12]}…, and experiment "
                f"{name!r} in {uri} already holds a different FINISHED run with it, "
                f"{other.info.run_name} ({other.info.run_id}), not imported from this archive: "
                f"nothing was imported. Import into another store (--uri), or delete that run "
                f"first (mlflow runs delete --run-id {other.info.run_id})"
            )
        out.create.append(run)
    return out


def _remap(tags: dict[str, str], ids: dict[str, str]) -> dict[str, str]:
    """``tags`` with every tag that names a run pointed at that run's id in this store."""

    def names_a_run(key: str) -> bool:
        return key in (PARENT_TAG, TUNED_TAG) or key.startswith(REFERENCE_PREFIXES)

    out = {k: ids.get(v, v) if names_a_run(k) else v for k, v in tags.items()}
    if MOVED_TAG in out:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            moved = [
                {**m, "sweep": ids.get(m["sweep"], m["sweep"])} for m in json.loads(out[MOVED_TAG])
            ]
            out[MOVED_TAG] = json.dumps(moved)
    return out


def _write(client: MlflowClient, run: ArchivedRun, new_id: str, ids: dict[str, str]) -> None:
    from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag

    tags = _remap({**run.tags, ORIGIN_TAG: run.tags.get(ORIGIN_TAG, run.run_id)}, ids)
    for batch in chunks([RunTag(k, v) for k, v in sorted(tags.items())]):
        client.log_batch(new_id, tags=batch, synchronous=True)
    params = [Param(k, v) for k, v in sorted(run.params.items())]
    for batch in chunks(params):
        client.log_batch(new_id, params=batch, synchronous=True)
    metrics = [Metric(k, v, ts, step) for k, step, ts, v in run.metrics]
    for batch in chunks(metrics, _METRICS_PER_BATCH):
        client.log_batch(new_id, metrics=batch, synchronous=True)
    if run.inputs:
        client.log_inputs(
            new_id,
            datasets=[
                DatasetInput(
                    Dataset(
                        d["name"],
                        d["digest"],
                        d["source_type"],
                        d["source"],
                        d.get("schema"),
                        d.get("profile"),
                    ),
                    tags=[InputTag(k, v) for k, v in sorted(d["tags"].items())],
                )
                for d in run.inputs
            ],
        )
    for path in run.artifacts:
        folder = str(Path(path).parent) if "/" in path else None
        client.log_artifact(new_id, str(run.folder / "artifacts" / path), folder)
    status, end = run.info["status"], run.info.get("end_time")
    if status != "RUNNING":
        client.set_terminated(new_id, status=status, end_time=end)
    if run.info.get("lifecycle_stage") == "deleted":
        client.delete_run(new_id)


def apply(archive: Archive, todo: Plan) -> list[str]:
    """Create the runs ``todo`` plans (``plan``), parents' ids and references remapped; return
    their new ids. A failure deletes the runs created so far and raises an ``AblateError``."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    from ablate.tracking.store import prepare

    if not todo.create:
        return []
    experiments = {}
    for name in sorted({r.info["experiment"] for r in todo.create}):
        experiments[name] = prepare(todo.uri, name)  # sqlite: artifacts beside the store
    client = MlflowClient(tracking_uri=todo.uri)
    ids = dict(todo.held)
    created: list[str] = []
    current = None
    try:
        for run in todo.create:  # first every run, so that references can name any of them
            current = run
            name = run.info.get("run_name") or ""
            new = client.create_run(
                experiments[run.info["experiment"]],
                start_time=run.info["start_time"],
                tags={MLFLOW_RUN_NAME: name, ORIGIN_TAG: run.tags.get(ORIGIN_TAG, run.run_id)},
            )
            created.append(new.info.run_id)
            ids[run.run_id] = new.info.run_id
        for run in todo.create:
            current = run
            _write(client, run, ids[run.run_id], ids)
    except BaseException as exc:
        for run_id in created:
            with contextlib.suppress(Exception):
                client.delete_run(run_id)
        where = f" at {current.describe()} ({current.folder})" if current else ""
        raise AblateError(
            f"the import into {todo.uri} stopped{where}: {type(exc).__name__}: {exc}; the "
            f"{len(created)} runs it had created are deleted again: fix the cause and import again"
        ) from exc
    return created


def import_archive(archive: Archive, uri: str) -> tuple[list[str], dict[str, str]]:
    """Import ``archive`` into the store at ``uri``: (the ids of the runs created, {archive run
    id: its id in the store} for every run of the archive)."""
    todo = plan(archive, uri)
    created = apply(archive, todo)
    ids = dict(todo.held)
    ids.update(zip((r.run_id for r in todo.create), created, strict=True))
    return created, ids
