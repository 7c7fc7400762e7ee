"""``python -m ablate.archive import``: an archive's runs into an MLflow store, each run once.

MLflow gives every new run an id of its own, so a run keeps who it is by its tags: its
``ablate.identity`` (what ``skip_finished`` and ``trainer.resume`` match) as it was, and its id in
the store it was exported from as ``ablate.archive.run_id``, by which a second import finds it
and adds nothing. That tag is written last: a run is created tagged ``ablate.archive.pending``,
so one that an import killed half-way left behind is replaced by the next import. Tags that name
another run (a sweep's parent, the runs a sweep reused, the lr study's trial a run took its lr
from) are pointed at that run's new id. Everything is checked before the first write; a failure
while writing deletes the runs created so far.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ablate.archive import (
    IDENTITY_TAG,
    MOVED_TAG,
    ORIGIN_TAG,
    PARENT_TAG,
    PENDING_TAG,
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
    """What an import does: the runs the store holds already (archive id -> store id), the runs
    it creates, and the runs a stopped import left unfinished that it deletes first."""

    uri: str
    held: dict[str, str] = field(default_factory=dict)
    create: list[ArchivedRun] = field(default_factory=list)
    replace: dict[str, str] = field(default_factory=dict)  # store id -> archive run id
    # held runs' tags that name a run, where one names a run in ``replace``: re-pointed
    refs: dict[str, dict[str, str]] = field(default_factory=dict)


def _is_new_sqlite(uri: str) -> bool:
    return uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()


def _latest(points: list[tuple[str, int, int, float]]) -> dict[str, float]:
    """Each metric's latest value as MLflow keeps it: the point of the largest step, then
    timestamp, then value."""
    best: dict[str, tuple[int, int, float]] = {}
    for key, step, ts, value in points:
        if key not in best or (step, ts, value) > best[key]:
            best[key] = (step, ts, value)
    return {key: point[2] for key, point in best.items()}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _differs(run: ArchivedRun, there) -> str | None:
    """What differs between ``run`` and the store's run ``there`` that holds it, or None."""
    what = []
    if there.info.status != run.info["status"]:
        what.append(f"status {there.info.status} here, {run.info['status']} in the archive")
    # an archived run without an end time got the import's time (MLflow's set_terminated)
    if run.info.get("end_time") is not None and there.info.end_time != run.info["end_time"]:
        what.append(f"end time {there.info.end_time} here, {run.info.get('end_time')} there")
    mine, theirs = there.data.metrics, _latest(run.metrics)
    if mine.keys() != theirs.keys() or any(not _same(mine[k], v) for k, v in theirs.items()):
        what.append("its metrics' latest points differ")
    return "; ".join(what) or None


def plan(archive: Archive, uri: str) -> Plan:
    """Check the store at ``uri`` against ``archive`` without writing: which runs it holds
    already, which a stopped import left unfinished (tag ``PENDING_TAG``: replaced), and an
    ``AblateError`` where it holds a different FINISHED run of the same identity, not imported
    from this archive (``skip_finished`` and the report would take one for the other). A held
    run whose archived record differs (exported again after it went on) is kept, with a
    warning."""
    out = Plan(uri)
    if _is_new_sqlite(uri):  # nothing to read: reading would create the file
        out.create = list(archive.runs)
        return out
    if uri.startswith(("http://", "https://")):
        from ablate.tracking.store import check_reachable

        check_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    own = {a: r.run_id for r in archive.runs for a in r.aliases}  # ids of this archive's runs
    by_alias: dict[tuple[str, str], list] = {}
    finished: dict[tuple[str, str], list] = {}
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
            for run in all_runs(client, exp.experiment_id, deleted=True):
                tags, active = run.data.tags, run.info.lifecycle_stage == "active"
                if PENDING_TAG in tags and ORIGIN_TAG not in tags:
                    if active and tags[PENDING_TAG] in own:
                        out.replace[run.info.run_id] = own[tags[PENDING_TAG]]
                    continue
                aliases = {run.info.run_id, tags.get(ORIGIN_TAG)} - {None}
                for alias in aliases:
                    by_alias.setdefault((name, alias), []).append(run)
                ours = bool(aliases & own.keys())  # this archive's, imported before it grew
                if active and not ours and run.info.status == "FINISHED" and IDENTITY_TAG in tags:
                    finished.setdefault((name, tags[IDENTITY_TAG]), []).append(run)
    except MlflowException as exc:
        raise AblateError(
            f"{uri}: the MLflow store is not readable ({exc}); pass another with --uri"
        ) from exc
    for run in archive.runs:
        name = run.info["experiment"]
        found = [s for a in sorted(run.aliases) for s in by_alias.get((name, a), [])]
        # a deleted store run holds a run deleted in the archive, not one an import rolled
        # back or a user deleted to have the archive's record again
        deleted = run.info.get("lifecycle_stage") == "deleted"
        there = next((s for s in found if s.info.lifecycle_stage == "active"), None) or next(
            (s for s in found if deleted), None
        )
        if there is not None:
            out.held[run.run_id] = there.info.run_id
            refs = _references(there.data.tags)
            if there.info.lifecycle_stage == "active" and _remap(refs, out.replace) != refs:
                out.refs[there.info.run_id] = refs  # written before a run now replaced
            if (what := _differs(run, there)) is not None:
                delete = (
                    f" or delete that run first (mlflow runs delete --run-id {there.info.run_id})"
                    if there.info.lifecycle_stage == "active"
                    else ""
                )
                print(
                    f"warning: {run.describe()} differs from the run {there.info.run_id} "
                    f"that {uri} holds for it ({what}): that run is kept; to have the "
                    "archive's record, import into a fresh store (--uri)" + delete,
                    file=sys.stderr,
                )
            continue
        ident = run.tags.get(IDENTITY_TAG)
        others = finished.get((name, ident), []) if run.info["status"] == "FINISHED" else []
        if others:
            other = others[0]
            raise AblateError(
                f"{run.folder}: {run.describe()} has identity {ident[:12]}…, and experiment "
                f"{name!r} in {uri} already holds a different FINISHED run with it, "
                f"{other.info.run_name} ({other.info.run_id}), not imported from this archive: "
                f"nothing was imported. Import into another store (--uri), or delete that run "
                f"first (mlflow runs delete --run-id {other.info.run_id})"
            )
        out.create.append(run)
    return out


def _names_a_run(key: str) -> bool:
    return key in (PARENT_TAG, TUNED_TAG) or key.startswith(REFERENCE_PREFIXES)


def _references(tags: dict[str, str]) -> dict[str, str]:
    """The tags of ``tags`` that name other runs."""
    return {k: v for k, v in tags.items() if _names_a_run(k) or k == MOVED_TAG}


def _remap(tags: dict[str, str], ids: dict[str, str]) -> dict[str, str]:
    """``tags`` with every tag that names a run pointed at that run's id in this store."""
    out = {k: ids.get(v, v) if _names_a_run(k) else v for k, v in tags.items()}
    if MOVED_TAG in out:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            moved = [
                {**m, "sweep": ids.get(m["sweep"], m["sweep"])} for m in json.loads(out[MOVED_TAG])
            ]
            out[MOVED_TAG] = json.dumps(moved)
    return out


def _origin(run: ArchivedRun) -> str:
    """The id ``ORIGIN_TAG`` holds for ``run``: the first store's, if it was imported itself."""
    return run.tags.get(ORIGIN_TAG, run.run_id)


def _create(client: MlflowClient, experiment_id: str, run: ArchivedRun) -> str:
    """A new run for ``run``, marked pending until ``_write`` has written it whole."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    name = run.info.get("run_name") or ""
    return client.create_run(
        experiment_id,
        start_time=run.info["start_time"],
        tags={MLFLOW_RUN_NAME: name, PENDING_TAG: _origin(run)},
    ).info.run_id


def _plain(run: ArchivedRun, path: str, tmp: Path) -> Path:
    """The artifact ``path`` of ``run`` as MLflow logged it, written into ``tmp/<path>`` under its
    own name: the bytes of its checked file (``ArchivedRun.artifact``, its sha256 checked again),
    decompressed where stored gzip-compressed (version 2), so that MLflow reads nothing of the
    archive's folder itself."""
    plain = tmp / path
    plain.parent.mkdir(parents=True, exist_ok=True)
    plain.write_bytes(run.artifact(path))
    return plain


def _write(client: MlflowClient, run: ArchivedRun, new_id: str, ids: dict[str, str]) -> None:
    from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag

    tags = _remap({k: v for k, v in run.tags.items() if k not in (ORIGIN_TAG, PENDING_TAG)}, ids)
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
    with tempfile.TemporaryDirectory() as tmp:
        for path in run.artifacts:
            folder = str(Path(path).parent) if "/" in path else None
            client.log_artifact(new_id, str(_plain(run, path, Path(tmp))), folder)
    status, end = run.info["status"], run.info.get("end_time")
    if status != "RUNNING":
        client.set_terminated(new_id, status=status, end_time=end)
    client.set_tag(new_id, ORIGIN_TAG, _origin(run))  # last: a run that has it is whole
    client.delete_tag(new_id, PENDING_TAG)
    if run.info.get("lifecycle_stage") == "deleted":
        client.delete_run(new_id)


def apply(archive: Archive, todo: Plan) -> list[str]:
    """Delete the runs a stopped import left unfinished (``todo.replace``), create the runs
    ``todo`` plans (``plan``), parents' ids and references remapped (a held run's too, where it
    named a replaced run); return their new ids. A failure deletes the runs created so far and
    raises an ``AblateError``."""
    from ablate.tracking.store import prepare

    client = MlflowClient(tracking_uri=todo.uri)
    if todo.replace:
        try:
            for run_id in todo.replace:
                client.delete_run(run_id)
        except MlflowException as exc:
            raise AblateError(
                f"{todo.uri}: run {run_id}, left unfinished by a stopped import, could not be "
                f"deleted ({exc}): nothing was imported; fix the cause and import again"
            ) from exc
        print(
            f"note: {len(todo.replace)} runs a stopped import left unfinished in {todo.uri} "
            f"(tag {PENDING_TAG}) are deleted and imported again"
        )
    experiments = {}
    for name in sorted({r.info["experiment"] for r in todo.create}):
        experiments[name] = prepare(todo.uri, name)  # sqlite: artifacts beside the store
    ids = dict(todo.held)
    created: list[str] = []
    current = None
    try:
        for run in todo.create:  # first every run, so that references can name any of them
            current = run
            created.append(_create(client, experiments[run.info["experiment"]], run))
            ids[run.run_id] = created[-1]
        for run in todo.create:
            current = run
            _write(client, run, ids[run.run_id], ids)
        current = None
        new_ids = {old: ids[run_id] for old, run_id in todo.replace.items()}
        for run_id, refs in todo.refs.items():
            for key, value in _remap(refs, new_ids).items():
                if value != refs[key]:
                    client.set_tag(run_id, key, value)
    except BaseException as exc:
        kept: list[str] = []
        for run_id in created:
            try:
                client.delete_run(run_id)
            except Exception as err:  # the store that failed the write may refuse this too
                kept.append(f"{run_id} ({type(err).__name__}: {err})")
        where = f" at {current.describe()} ({current.folder})" if current else ""
        undone = (
            f"{len(kept)} of the {len(created)} runs it had created could not be deleted "
            f"again, {kept[0]}{' and others' if len(kept) > 1 else ''}: the next import keeps "
            f"those it had written whole and replaces the rest (tag {PENDING_TAG})"
            if kept
            else f"the {len(created)} runs it had created are deleted again"
        )
        raise AblateError(
            f"the import into {todo.uri} stopped{where}: {type(exc).__name__}: {exc}; "
            f"{undone}: fix the cause and import again"
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
