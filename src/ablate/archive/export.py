"""``python -m ablate.archive export``: the runs a report covers (the report's own filters), their
sweeps' parent runs and the lr-study trials their lrs came from, written as an archive folder."""

from __future__ import annotations

import shutil
import tempfile
from argparse import Namespace
from pathlib import Path
from typing import Any

from ablate.archive import (
    ARTIFACTS,
    FORMAT,
    GZ,
    INDEX,
    MANIFEST,
    METRICS,
    METRICS_HEADER,
    PARENT_TAG,
    RUNS,
    VERSION,
    dumps,
    number,
    report_args,
    stored_name,
)
from ablate.config import TUNED_TAG
from ablate.errors import AblateError
from ablate.fileio import sha256_file, write_gzip
from ablate.report.load import FILTERS, MlflowClient, MlflowException
from ablate.tracking.store import all_runs


def _scope(runs_source: dict[str, str]) -> dict[str, Any]:
    """The report's filters as the archive records them: what ``report_args`` turns back into
    the command that covers the same runs."""

    def listed(key: str) -> list[str] | None:
        return sorted(runs_source[key].split(",")) if runs_source.get(key) else None

    # a sweep's folder is recorded resolved (absolute); anything else there says the report
    # found no sweep and covered every run
    sweep = runs_source.get("sweep")
    return {
        "experiment": runs_source["experiment"],
        "sweep": sweep if sweep and Path(sweep).is_absolute() else None,
        **{key: listed(key) for key in FILTERS},
        "metric": runs_source.get("metric"),
    }


def _study_trials(client: MlflowClient, run) -> list:
    """Every trial of the lr study whose best trial gave ``run`` its lr (``TUNED_TAG``): the
    runs tagged with that trial's ``study`` in its experiment."""
    try:
        trial = client.get_run(run.data.tags[TUNED_TAG])
    except MlflowException:
        print(
            f"note: the lr-study trial {run.data.tags[TUNED_TAG]} of {run.info.run_name} is "
            "no longer in the store: its study is not archived"
        )
        return []
    study = trial.data.tags.get("study")
    if not study:
        return [trial]
    name = study.replace("'", "\\'")
    return all_runs(client, trial.info.experiment_id, f"tags.study = '{name}'")


def collect(client: MlflowClient, selected: list[str]) -> dict[str, tuple[Any, str]]:
    """{run id: (run, role)} of ``selected`` (role ``run``), the lr-study trials of the tuned
    ones (``trial``) and the parent runs of all of them (``sweep``)."""
    out: dict[str, tuple[Any, str]] = {}
    for run_id in selected:
        out[run_id] = (client.get_run(run_id), "run")
    for run, _ in list(out.values()):
        if TUNED_TAG in run.data.tags:
            for trial in _study_trials(client, run):
                out.setdefault(trial.info.run_id, (trial, "trial"))
    pending = [r for r, _ in out.values()]
    while pending:  # parents, and a parent's own parent
        parent = pending.pop().data.tags.get(PARENT_TAG)
        if parent and parent not in out:
            try:
                run = client.get_run(parent)
            except MlflowException:
                continue  # a parent deleted since: the child keeps the id it names
            out[parent] = (run, "sweep")
            pending.append(run)
    return out


def _history(client: MlflowClient, run) -> str:
    points = []
    for key in sorted(run.data.metrics):
        for m in client.get_metric_history(run.info.run_id, key):
            points.append((key, int(m.step), int(m.timestamp), number(m.value)))
    rows = [f"{k}\t{s}\t{t}\t{v}" for k, s, t, v in sorted(points)]
    return "\n".join([METRICS_HEADER, *rows]) + "\n"


def _inputs(run) -> list[dict[str, Any]]:
    inputs = run.inputs.dataset_inputs if run.inputs is not None else []
    out = []
    for d in inputs:
        ds = d.dataset
        out.append(
            {
                "name": ds.name,
                "digest": ds.digest,
                "source_type": ds.source_type,
                "source": ds.source,
                "schema": ds.schema,
                "profile": ds.profile,
                "tags": {t.key: t.value for t in d.tags},
            }
        )
    return sorted(out, key=dumps)


def _write_run(client: MlflowClient, run, experiment: str, folder: Path) -> None:
    info = run.info
    folder.mkdir(parents=True)
    (folder / "info.json").write_text(
        dumps(
            {
                "run_id": info.run_id,
                "run_name": info.run_name,
                "experiment": experiment,
                "status": info.status,
                "start_time": info.start_time,
                "end_time": info.end_time,
                "lifecycle_stage": info.lifecycle_stage,
            }
        ),
        encoding="utf-8",
    )
    (folder / "params.json").write_text(dumps(dict(run.data.params)), encoding="utf-8")
    (folder / "tags.json").write_text(dumps(dict(run.data.tags)), encoding="utf-8")
    (folder / "inputs.json").write_text(dumps(_inputs(run)), encoding="utf-8")
    write_gzip(folder / stored_name(METRICS), _history(client, run).encode("utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        for path in ARTIFACTS:
            if not _has_artifact(client, run, path):
                continue  # a run that has none (a sweep's parent, a failed run)
            try:
                got = Path(client.download_artifacts(info.run_id, path, tmp))
            except (MlflowException, OSError) as exc:
                raise _unreadable(run, path, exc) from exc
            target = folder / "artifacts" / stored_name(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.name.endswith(GZ):  # predictions: ~120 KB of JSON a split
                write_gzip(target, got.read_bytes())
            else:
                shutil.copyfile(got, target)  # streamed: an artifact need not fit in memory


def _unreadable(run, path: str, why: object) -> AblateError:
    return AblateError(
        f"run {run.info.run_name} ({run.info.run_id}): its artifact {path} is not readable "
        f"({why}): nothing was exported (an earlier archive there is kept); make the store's "
        f"artifacts reachable ({run.info.artifact_uri}) and export again"
    )


def _has_artifact(client: MlflowClient, run, path: str) -> bool:
    """Whether ``run`` holds the artifact ``path``: False only where it really has none; an
    ``AblateError`` where its artifacts cannot be read."""
    from mlflow.utils.file_utils import local_file_uri_to_path
    from mlflow.utils.uri import is_local_uri

    parent = str(Path(path).parent) if "/" in path else None
    try:
        listed = {f.path for f in client.list_artifacts(run.info.run_id, parent) if not f.is_dir}
    except (MlflowException, OSError) as exc:
        raise _unreadable(run, path, exc) from exc
    if path in listed:
        return True
    uri = run.info.artifact_uri
    if is_local_uri(uri, is_tracking_or_registry_uri=False):
        # MLflow lists a missing folder as empty: a run without artifacts has no folder, but the
        # one its folder sits in (the experiment's artifact location) is there unless the
        # store's artifacts are not
        root = Path(local_file_uri_to_path(uri)).parent.parent
        if not root.is_dir():
            raise _unreadable(run, path, f"{root} does not exist")
    return False


def write_manifest(folder: Path) -> None:
    """Write ``SHA256SUMS``: the sha256 of every other file of ``folder``, by path."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    lines = [f"{sha256_file(folder / name)}  {name}" for name in files if name != MANIFEST]
    (folder / MANIFEST).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _target(out: Path) -> None:
    """``out`` must be new, empty or an archive (which the export replaces)."""
    if out.exists() and not out.is_dir():
        raise AblateError(f"{out} is a file; pass a new or empty folder to write the archive to")
    if out.is_dir() and any(out.iterdir()) and not (out / INDEX).is_file():
        raise AblateError(
            f"{out} holds files that are no archive; pass a new or empty folder (or an earlier "
            "archive, which is replaced)"
        )


def export(args: Namespace, out: Path) -> dict[str, int]:
    """Write the runs the report's filters in ``args`` select (``ablate.report.cli``) to the
    archive folder ``out``; return how many runs of each role it holds."""
    from ablate.report.cli import _load  # the report's own choice of runs, sweep fallback too

    _target(out)
    runs = _load(args)
    uri = runs.source["uri"]
    client = MlflowClient(tracking_uri=uri)
    found = collect(client, list(runs.runs.run_id))
    if not found:
        raise AblateError(
            f"no runs match these filters in experiment {args.experiment!r} of {uri}: nothing to "
            "archive; change the filters (the report's: --sweep, --all, --data, ...)"
        )
    names = {}
    for run, _ in found.values():
        if run.info.experiment_id not in names:
            names[run.info.experiment_id] = client.get_experiment(run.info.experiment_id).name
    order = sorted(
        found.values(),
        key=lambda x: (names[x[0].info.experiment_id], x[0].info.start_time, x[0].info.run_id),
    )
    scope = _scope(runs.source)
    index = {
        "format": FORMAT,
        "version": VERSION,
        "scope": scope,
        "report": ["python", "-m", "ablate.report", *report_args(scope)],
        "runs": [
            {
                "run_id": r.info.run_id,
                "run_name": r.info.run_name,
                "role": role,
                "experiment": names[r.info.experiment_id],
            }
            for r, role in order
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    # written beside, then swapped in: an export that fails leaves the earlier archive whole
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for run, _ in order:
            name = names[run.info.experiment_id]
            _write_run(client, run, name, tmp / RUNS / run.info.run_id)
        (tmp / INDEX).write_text(dumps(index), encoding="utf-8")
        write_manifest(tmp)
        tmp.chmod(0o755)  # mkdtemp's 0700 would make the archive private
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    counts: dict[str, int] = {}
    for _, role in order:
        counts[role] = counts.get(role, 0) + 1
    return counts
