"""A study's record as plain-text files (``python -m ablate.archive``): the runs a report covers,
with the lr-study trials their lrs came from, exported from one MLflow store and imported into
any other, so a study outlives the machine it ran on.

An archive is a folder (version 2)::

    archive.json              what it holds: its format and version, its scope (the report's
                              filters), the report command that reads it, and its runs in order
    runs/<run id>/info.json   run id, name, experiment, status, start/end time, lifecycle
                  params.json, tags.json, inputs.json (MLflow's log_input datasets)
                  metrics.tsv.gz    every point of every metric, gzip-compressed TSV: key, step,
                                    timestamp, value
                  artifacts/  the artifacts the report reads (``ARTIFACTS``): config.yaml as it
                              is, predictions/dev.json and predictions/test.json (each where
                              the run logged it) gzip-compressed as predictions/<split>.json.gz
    SHA256SUMS                sha256 of every other file as stored, the .gz ones compressed
                              (``sha256sum -c SHA256SUMS`` checks it)

The bulk, a run's metric points and predictions, is kept gzip-compressed (``COMPRESSED``; a
tenth of the bytes), the rest plain text, so that a change to a run reads as a diff. Version 1
kept every file plain (``metrics.tsv``, ``predictions/dev.json``); ``read`` reads both, by the
version in archive.json, and an import of either gives the same store. The same store gives the
same bytes: keys sorted, runs and points in a fixed order, no date of export, gzip without a
time or a name (``ablate.fileio.write_gzip``). ``read`` checks the archive whole before
anything is imported (``ablate.archive.checked``: no symbolic link, no path that leaves it,
every file against ``SHA256SUMS``), then decompresses and parses it; an import reads those
checked files only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.archive.checked import (
    INDEX,
    RUN_ID,
    Files,
    check,
    damaged,
    not_an_archive,
    refused,
)
from ablate.archive.checked import MANIFEST as MANIFEST  # what export writes, the docs name
from ablate.errors import AblateError
from ablate.fileio import gunzip

FORMAT = "ablate-archive"
VERSION = 2  # the version an export writes
READS = (1, 2)  # the versions ``read`` reads
RUNS = "runs"
# The artifacts an archive keeps: the report's paired bootstraps read a run's dev and test
# predictions, its McNemar test the test ones; config.yaml says what ran (the whole resolved
# config). Models, checkpoints and the rest stay out.
ARTIFACTS = ("config.yaml", "predictions/dev.json", "predictions/test.json")
METRICS = "metrics.tsv"
GZ = ".gz"
# What version 2 keeps gzip-compressed, as <name>.gz: a run's metrics and, under artifacts/, its
# predictions (~120 KB of JSON a split on Naija, a tenth of that compressed)
COMPRESSED = (METRICS, "predictions/dev.json", "predictions/test.json")
# An imported run's tag: the id the run had in the store it was exported from.
ORIGIN_TAG = "ablate.archive.run_id"
# A run an import has created but not yet written whole (its value: the id ORIGIN_TAG will hold);
# ORIGIN_TAG is written last, so a run still pending is one a stopped import left unfinished.
PENDING_TAG = "ablate.archive.pending"
IDENTITY_TAG = "ablate.identity"
# Tags whose value is another run's id: an import points them at that run's new id.
PARENT_TAG = "mlflow.parentRunId"
REFERENCE_PREFIXES = ("ablate.reused.",)
# A run a later sweep resumed names the sweeps it left: a JSON list of {"sweep": <run id>, ...}.
MOVED_TAG = "ablate.moved_from"
METRICS_HEADER = "key\tstep\ttimestamp\tvalue"


def stored_name(name: str, version: int = VERSION) -> str:
    """The name under which an archive of ``version`` keeps ``name`` (``METRICS``, or an
    artifact's path under artifacts/): ``name.gz`` where it is compressed."""
    return name + GZ if version >= 2 and name in COMPRESSED else name


def dumps(obj: Any) -> str:
    """JSON as an archive writes it: sorted keys, one key a line, a final newline."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def number(value: float) -> str:
    """A metric value as text that reads back to the same float (``repr``; nan, inf too)."""
    return repr(float(value))


@dataclass
class ArchivedRun:
    """One run of an archive, as read from its files."""

    folder: Path
    info: dict[str, Any]
    params: dict[str, str]
    tags: dict[str, str]
    inputs: list[dict[str, Any]]
    metrics: list[tuple[str, int, int, float]]  # key, step, timestamp, value
    artifacts: list[str] = field(default_factory=list)  # MLflow paths, as logged (not .gz)
    version: int = VERSION  # the archive's: how its files are stored
    files: Files | None = None  # the archive's files as checked: what ``artifact`` reads

    def stored(self, path: str) -> Path:
        """The file that holds the artifact ``path`` (one of ``artifacts``): gzip-compressed
        where its name ends in .gz."""
        return self.folder / "artifacts" / stored_name(path, self.version)

    def artifact(self, path: str) -> bytes:
        """The bytes of the artifact ``path`` as MLflow logged it, read from the checked files
        (``Files.read``: its sha256 checked again) and decompressed where stored so."""
        if self.files is None:
            raise ValueError(f"{self.describe()}: not read from an archive (ablate.archive.read)")
        name = self.stored(path).relative_to(self.files.folder).as_posix()
        raw = self.files.read(name)
        return gunzip(raw) if name.endswith(GZ) else raw

    @property
    def run_id(self) -> str:
        return self.info["run_id"]

    @property
    def aliases(self) -> set[str]:
        """The ids this run has had: its own and, if it was imported itself, its origin's."""
        return {self.run_id, *([self.tags[ORIGIN_TAG]] if ORIGIN_TAG in self.tags else [])}

    def describe(self) -> str:
        return f"run {self.info.get('run_name') or '-'} ({self.run_id})"


@dataclass
class Archive:
    """An archive read and checked (``read``)."""

    folder: Path
    index: dict[str, Any]
    runs: list[ArchivedRun]

    def counts(self) -> dict[str, int]:
        """How many runs of each role (``run``, ``sweep``, ``trial``) it holds."""
        out: dict[str, int] = {}
        for entry in self.index["runs"]:
            out[entry["role"]] = out.get(entry["role"], 0) + 1
        return out


def _json(files: Files, name: str) -> Any:
    path = files.folder / name
    if name not in files:
        raise damaged(path, f"{INDEX} lists its run but the file is missing")
    try:
        return json.loads(files.read(name).decode("utf-8"))
    except ValueError as exc:
        raise damaged(path, f"not readable as JSON ({exc})") from exc


def _typed(files: Files, name: str, kind: type) -> Any:
    """The JSON file ``name``: an object (``dict``) or an array (``list``), as ``kind`` says."""
    value = _json(files, name)
    if not isinstance(value, kind):
        what = "an object" if kind is dict else "an array"
        raise damaged(files.folder / name, f"its JSON is not {what}")
    return value


def _gunzip(files: Files, name: str) -> bytes:
    try:
        return gunzip(files.read(name))
    except ValueError as exc:
        raise damaged(files.folder / name, str(exc)) from exc


def _stored(files: Files, folder: str, name: str, version: int) -> str:
    """The file of ``folder`` (a run's, or its artifacts/) that holds ``name`` in an archive of
    ``version``; ``damaged`` where it is missing or stored the other version's way."""
    want = f"{folder}/{stored_name(name, version)}"
    other = f"{folder}/{name}" if want.endswith(GZ) else f"{folder}/{name}{GZ}"
    if name in COMPRESSED and other in files:
        how = f"{'gzip-compressed' if version >= 2 else 'plain'}, as {Path(want).name}"
        raise damaged(
            files.folder / other, f"an archive of version {version} keeps this file {how}"
        )
    if want not in files:
        raise damaged(files.folder / want, f"{INDEX} lists its run but the file is missing")
    return want


def _artifacts(files: Files, run: str, version: int) -> list[str]:
    """The MLflow paths of the artifacts the run folder ``run`` holds, by the checked files'
    names (``Files.under``), each compressed one decompressed once (a broken gzip stream:
    ``damaged``, before anything is imported)."""
    art = f"{run}/artifacts"
    out = []
    for name in files.under(art):
        path = name.removesuffix(GZ)
        if path not in COMPRESSED:  # stored as it is in every version (config.yaml)
            out.append(name)
            continue
        if (stored := _stored(files, art, path, version)).endswith(GZ):
            _gunzip(files, stored)
        out.append(path)
    return out


def _metrics(files: Files, name: str) -> list[tuple[str, int, int, float]]:
    path = files.folder / name
    raw = _gunzip(files, name) if name.endswith(GZ) else files.read(name)
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise damaged(path, f"not UTF-8 text ({exc})") from exc
    if not lines or lines[0] != METRICS_HEADER:
        raise damaged(path, f"its first line is not {METRICS_HEADER!r}")
    points = []
    for n, line in enumerate(lines[1:], 2):
        try:
            key, step, ts, value = line.split("\t")
            points.append((key, int(step), int(ts), float(value)))
        except ValueError as exc:
            raise damaged(path, f"line {n} is not key, step, timestamp, value") from exc
    return points


def _entries(folder: Path, index: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs ``index`` lists, each with a role and a run id that names one folder inside the
    archive (``RUN_ID``), none twice."""
    path, entries = folder / INDEX, index.get("runs", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise damaged(path, "its runs are not a list of objects")
    seen = set()
    for n, entry in enumerate(entries, 1):
        run_id = entry.get("run_id")
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise refused(
                path, f"its run {n} has the run id {run_id!r}, not an MLflow run id (a letter or "
                "digit, then letters, digits, '_' or '-'): no folder runs/<run id> of the archive"
            )  # fmt: skip
        if run_id in seen:
            raise damaged(path, f"it lists run {run_id} twice")
        if not isinstance(entry.get("role"), str):
            raise damaged(path, f"its run {run_id} has no role")
        seen.add(run_id)
    return entries


def read(folder: str | Path) -> Archive:
    """The archive in ``folder`` (version 1 or 2), checked whole (``checked.check``: no link, no
    path outside it, every file against ``SHA256SUMS``), then each file decompressed where its
    version compresses it and parsed; an ``AblateError`` naming the file and the fix otherwise.
    Nothing is imported here; what an import reads is only these checked files."""
    folder = Path(folder)
    files = check(folder)
    index = _json(files, INDEX)
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise not_an_archive(folder, f"{INDEX} does not say format {FORMAT!r}")
    version = index.get("version")
    if version not in READS or isinstance(version, bool):
        raise AblateError(
            f"{folder / INDEX}: archive version {version!r}; this ablate reads versions "
            f"{', '.join(map(str, READS))}: import it with the ablate version that exported it"
        )
    runs = []
    for entry in _entries(folder, index):
        name = f"{RUNS}/{entry['run_id']}"
        if not files.under(name):
            raise damaged(folder / name, f"{INDEX} lists it but it is missing")
        info = _typed(files, f"{name}/info.json", dict)
        if info.get("run_id") != entry["run_id"]:
            raise damaged(
                folder / name / "info.json", f"its run_id is not {entry['run_id']}, the id "
                f"{INDEX} lists for its folder"
            )  # fmt: skip
        runs.append(
            ArchivedRun(
                folder / name,
                info,
                _typed(files, f"{name}/params.json", dict),
                _typed(files, f"{name}/tags.json", dict),
                _typed(files, f"{name}/inputs.json", list),
                _metrics(files, _stored(files, name, METRICS, version)),
                _artifacts(files, name, version),
                version,
                files,
            )
        )
    return Archive(folder, index, runs)


def report_args(scope: dict[str, Any]) -> list[str]:
    """The ``python -m ablate.report`` arguments that cover an archive's runs (its scope)."""
    from ablate.report.load import FILTERS  # reading an archive needs no MLflow

    args = ["--experiment", scope["experiment"]]
    args += ["--sweep", scope["sweep"]] if scope.get("sweep") else ["--all"]
    for key in FILTERS:
        if scope.get(key):
            args += [f"--{key}", *scope[key]]
    if scope.get("metric"):
        args += ["--metric", scope["metric"]]
    return args
