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
                              is, predictions/dev.json gzip-compressed as predictions/dev.json.gz
    SHA256SUMS                sha256 of every other file as stored, the .gz ones compressed
                              (``sha256sum -c SHA256SUMS`` checks it)

The bulk, a run's metric points and predictions, is kept gzip-compressed (``COMPRESSED``; a
tenth of the bytes), the rest plain text, so that a change to a run reads as a diff. Version 1
kept every file plain (``metrics.tsv``, ``predictions/dev.json``); ``read`` reads both, by the
version in archive.json, and an import of either gives the same store. The same store gives the
same bytes: keys sorted, runs and points in a fixed order, no date of export, gzip without a
time or a name (``ablate.fileio.write_gzip``). ``read`` checks every file against
``SHA256SUMS``, decompresses and parses it before anything is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.errors import AblateError
from ablate.fileio import read_gzip, sha256_file

FORMAT = "ablate-archive"
VERSION = 2  # the version an export writes
READS = (1, 2)  # the versions ``read`` reads
INDEX = "archive.json"
MANIFEST = "SHA256SUMS"
RUNS = "runs"
# The artifacts an archive keeps: the report's paired bootstrap reads a run's dev predictions;
# config.yaml says what ran (the whole resolved config). Models, checkpoints and the rest stay out.
ARTIFACTS = ("config.yaml", "predictions/dev.json")
METRICS = "metrics.tsv"
GZ = ".gz"
# What version 2 keeps gzip-compressed, as <name>.gz: a run's metrics and, under artifacts/, its
# predictions (~120 KB of JSON a run, a tenth of that compressed)
COMPRESSED = (METRICS, "predictions/dev.json")
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

    def stored(self, path: str) -> Path:
        """The file that holds the artifact ``path`` (one of ``artifacts``): ``read_gzip`` reads
        it where its name ends in .gz."""
        return self.folder / "artifacts" / stored_name(path, self.version)

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


def _not_an_archive(folder: Path, why: str) -> AblateError:
    return AblateError(
        f"{folder} is not an ablate archive ({why}); pass the folder that "
        "`python -m ablate.archive export` wrote"
    )


def _damaged(path: Path, why: str) -> AblateError:
    return AblateError(
        f"{path}: {why}: the archive was truncated or edited after export; export it again from "
        "its store, or restore the file (e.g. git checkout of the archive folder)"
    )


def _manifest(folder: Path) -> dict[str, str]:
    """``SHA256SUMS`` as {relative path: sha256}, every file of ``folder`` checked against it."""
    listed: dict[str, str] = {}
    path = folder / MANIFEST
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise _damaged(path, f"line {n} is not '<sha256>  <file>'")
        listed[name] = digest
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {
        MANIFEST
    }
    for name in sorted(present - listed.keys()):
        raise _damaged(folder / name, f"not listed in {MANIFEST}")
    for name, digest in sorted(listed.items()):
        file = folder / name
        if not file.is_file():
            raise _damaged(file, f"listed in {MANIFEST} but missing")
        if sha256_file(file) != digest:
            raise _damaged(file, f"its sha256 differs from the one in {MANIFEST}")
    return listed


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _damaged(path, f"not readable as JSON ({exc})") from exc


def _gunzip(path: Path) -> bytes:
    try:
        return read_gzip(path)
    except ValueError as exc:
        raise _damaged(path, str(exc)) from exc


def _stored(folder: Path, name: str, version: int) -> Path:
    """The file of ``folder`` (a run's, or its artifacts/) that holds ``name`` in an archive of
    ``version``; ``_damaged`` where it is missing or stored the other version's way."""
    want = folder / stored_name(name, version)
    other = folder / (name if want.name.endswith(GZ) else name + GZ)
    if name in COMPRESSED and other.is_file():
        how = f"gzip-compressed, as {want.name}" if version >= 2 else f"plain, as {want.name}"
        raise _damaged(other, f"an archive of version {version} keeps this file {how}")
    if not want.is_file():
        raise _damaged(want, f"{INDEX} lists its run but the file is missing")
    return want


def _artifacts(run_dir: Path, version: int) -> list[str]:
    """The MLflow paths of the artifacts ``run_dir`` holds, each compressed one decompressed
    once (a broken gzip stream: ``_damaged``, before anything is imported)."""
    art = run_dir / "artifacts"
    out = []
    for name in sorted(p.relative_to(art).as_posix() for p in art.rglob("*") if p.is_file()):
        path = name.removesuffix(GZ)
        if path not in COMPRESSED:  # stored as it is in every version (config.yaml)
            out.append(name)
            continue
        if _stored(art, path, version).name.endswith(GZ):
            _gunzip(art / name)
        out.append(path)
    return out


def _metrics(path: Path) -> list[tuple[str, int, int, float]]:
    raw = _gunzip(path) if path.name.endswith(GZ) else path.read_bytes()
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise _damaged(path, f"not UTF-8 text ({exc})") from exc
    if not lines or lines[0] != METRICS_HEADER:
        raise _damaged(path, f"its first line is not {METRICS_HEADER!r}")
    points = []
    for n, line in enumerate(lines[1:], 2):
        try:
            key, step, ts, value = line.split("\t")
            points.append((key, int(step), int(ts), float(value)))
        except ValueError as exc:
            raise _damaged(path, f"line {n} is not key, step, timestamp, value") from exc
    return points


def read(folder: str | Path) -> Archive:
    """The archive in ``folder`` (version 1 or 2), every file checked against ``SHA256SUMS``,
    decompressed where its version compresses it, and parsed; an ``AblateError`` naming the file
    and the fix otherwise. Nothing is imported here."""
    folder = Path(folder)
    if not folder.is_dir():
        raise _not_an_archive(folder, "no such folder")
    for name in (INDEX, MANIFEST):
        if not (folder / name).is_file():
            raise _not_an_archive(folder, f"it has no {name}")
    _manifest(folder)
    index = _json(folder / INDEX)
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _not_an_archive(folder, f"{INDEX} does not say format {FORMAT!r}")
    version = index.get("version")
    if version not in READS or isinstance(version, bool):
        raise AblateError(
            f"{folder / INDEX}: archive version {version!r}; this ablate reads versions "
            f"{', '.join(map(str, READS))}: import it with the ablate version that exported it"
        )
    runs = []
    for entry in index.get("runs", []):
        run_dir = folder / RUNS / entry["run_id"]
        if not run_dir.is_dir():
            raise _damaged(run_dir, f"{INDEX} lists it but it is missing")
        runs.append(
            ArchivedRun(
                run_dir,
                _json(run_dir / "info.json"),
                _json(run_dir / "params.json"),
                _json(run_dir / "tags.json"),
                _json(run_dir / "inputs.json"),
                _metrics(_stored(run_dir, METRICS, version)),
                _artifacts(run_dir, version),
                version,
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
