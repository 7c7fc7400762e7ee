"""A run's record kept in its job folder as it is sent, so that a tracking server going away
loses nothing: what it could not send waits there (training goes on) and is sent when the
server answers again; at the end of the run the journal waits ``tracking.outage_min`` for the
server, and failing that stays behind for ``python -m ablate.tracking.replay <job folder>``.

MLflow has no such buffer: its HTTP client retries one request for minutes and then raises,
losing that record and the run's end (its async logging keeps a queue in memory only).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from ablate.errors import AblateError
from ablate.fileio import write_atomic
from ablate.tracking.auth import environ, health

log = logging.getLogger("ablate")

FOLDER = "mlflow_journal"  # in the job folder
_LINES, _SENT, _FILES = "journal.jsonl", "sent", "files"
_BATCH = 100  # MLflow's limit of params (and tags) per log_batch call
_ENTITIES = 1000  # and of params, tags and metrics in all (metrics alone: the same)
_GATHERED = ("params", "tags", "metrics")  # the records one log_batch call can hold
_WAITING = (*_GATHERED, "dataset")  # with ``gather``: sent with the next record of another kind


def answers(uri: str, timeout: float = 2.0) -> bool:
    """Whether the store at ``uri`` answers now (a file store always does).

    A refusal (401 or 403, e.g. from a proxy in front) is an answer, not an outage: the record
    that failed then raises its reason instead of waiting ``tracking.outage_min`` for nothing.
    """
    if not uri.startswith(("http://", "https://")):
        return True
    status = health(uri, timeout)
    return status is not None and status < 500


# MLflow retries a request that finds no server for minutes (7 tries, exponential back-off),
# holding training that long; a record the journal keeps needs no such wait. Its sends try
# briefly, and an absent server is the journal's to handle.
BRIEF_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


class Journal:
    """Every record of one run, appended to ``<folder>/journal.jsonl`` and then sent in order."""

    def __init__(self, folder: Path, uri: str, run_id: str, gather: bool = False):
        """``gather``: params, tags, metrics and datasets wait for the next record of another
        kind (or a ``flush``) and go with the records before them in one ``log_batch`` (datasets
        in one ``log_inputs``): a store commits per call, and a run records dozens of them."""
        self.folder, self.uri, self.run_id = Path(folder), uri, run_id
        self.gather = gather
        self.client = MlflowClient(tracking_uri=uri)
        self.down_since: float | None = None
        self._count = self._sent = 0
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lines = self.folder / _LINES
        self._sent_file = self.folder / _SENT
        if not self._lines.exists():
            self._append({"op": "run", "uri": uri, "run_id": run_id})
            self._mark_sent(1)
        raw = self._lines.read_bytes()
        whole = raw[: raw.rfind(b"\n") + 1]  # a line cut short by a kill mid-write: dropped
        if len(whole) != len(raw):
            with self._lines.open("r+b") as f:
                f.truncate(len(whole))
        entries = [json.loads(line) for line in whole.decode().splitlines() if line.strip()]
        self._count = len(entries)
        self._sent = int(self._sent_file.read_text() or 0)
        self._pending = entries[self._sent :]  # in memory: the file is only appended to
        self.ended = any(e["op"] == "end" for e in entries)  # the run's end is recorded

    @classmethod
    def reopen(cls, folder: Path, uri: str | None = None) -> Journal:
        """The journal left in ``folder`` (a job folder or the journal's own), optionally sent
        to another ``uri`` than the one it recorded."""
        folder = Path(folder)
        if (folder / FOLDER / _LINES).is_file():
            folder = folder / FOLDER
        if not (folder / _LINES).is_file():
            raise AblateError(f"{folder}: no {FOLDER}/{_LINES} here (is it a job folder?)")
        head = json.loads((folder / _LINES).open().readline())
        return cls(folder, uri or head["uri"], head["run_id"])

    # -- recording ------------------------------------------------------------------------
    def params(self, params: Mapping[str, Any]) -> None:
        self.add("params", params={k: str(v) for k, v in params.items()})

    def tags(self, tags: Mapping[str, Any]) -> None:
        self.add("tags", tags={k: str(v) for k, v in tags.items()})

    def untag(self, keys: Iterable[str]) -> None:
        self.add("untag", keys=list(keys))

    def metrics(self, metrics: Mapping[str, float], step: int | None) -> None:
        values = {k: float(v) for k, v in metrics.items()}
        self.add("metrics", metrics=values, step=step or 0, ts=int(time.time() * 1000))

    def text(self, text: str, path: str) -> None:
        self.add("text", text=text, path=path)

    def files(self, folder: str, path: str) -> None:
        """Artifacts of ``folder`` (copied here: the caller's folder may be temporary)."""
        n = self._count
        shutil.copytree(folder, self.folder / _FILES / str(n))
        self.add("files", folder=f"{_FILES}/{n}", path=path)

    def dataset(self, name: str, source: str, digest: str, context: str) -> None:
        self.add("dataset", name=name, source=source, digest=digest, context=context)

    def model(self, folder: str, name: str) -> None:
        """The MLflow model saved in ``folder`` (copied here), logged as the run's logged model
        ``name``: ``runs:/<run id>/<name>``."""
        n = self._count
        shutil.copytree(folder, self.folder / _FILES / str(n))
        self.add("model", folder=f"{_FILES}/{n}", name=name)

    def end(self, status: str) -> None:
        self.ended = True
        self.add("end", status=status, ts=int(time.time() * 1000))

    def add(self, op: str, **fields: Any) -> None:
        """Append one record, then send what is pending if the store answers."""
        entry = {"op": op, **fields}
        self._append(entry)
        self._pending.append(entry)
        if not (self.gather and op in _WAITING):
            self.flush()

    # -- sending --------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Records not yet in the store."""
        return len(self._pending)

    def flush(self) -> bool:
        """Send the pending records in order; False (and the rest kept) while the store is
        away. A store that answers but refuses a record raises."""
        if not self._pending:
            return True
        if not answers(self.uri):
            self._went_away()
            return False
        while self._pending:
            n = gathered(self._pending)
            try:
                with environ(BRIEF_RETRIES):
                    self._send_first(n)
            except Exception:
                if not answers(self.uri):
                    self._went_away()
                    return False
                self._send_first(n)  # it answers: MLflow's own retries; a refusal raises
            del self._pending[:n]
            self._mark_sent(self._sent + n)
        if self.down_since is not None:
            log.info("tracking server %s answers again: the run's record is complete", self.uri)
            self.down_since = None
        return True

    def wait_and_flush(self, minutes: float) -> None:
        """At the run's end: send everything, waiting up to ``minutes`` for an absent store.
        Raises a one-line ``AblateError`` naming the replay command if it never answers."""
        deadline = time.monotonic() + minutes * 60
        if not self.flush():
            log.warning(
                "tracking server %s does not answer: waiting up to %g min to send the run's "
                "record (kept in %s)",
                self.uri,
                minutes,
                self.folder,
            )
        while not self.flush():
            if time.monotonic() > deadline:
                raise AblateError(
                    f"tracking.uri={self.uri}: no answer for {minutes:g} min "
                    f"(tracking.outage_min); nothing is lost: the run's record is kept in "
                    f"{self.folder}; once the server is back, log it with: "
                    f"python -m ablate.tracking.replay {self.folder.parent}"
                )
            time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))

    def remove(self) -> None:
        """Delete the journal once everything is in the store."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def _went_away(self) -> None:
        if self.down_since is None:
            self.down_since = time.time()
            log.warning(
                "tracking server %s does not answer: training goes on, the run's record is "
                "kept in %s and sent when the server is back",
                self.uri,
                self.folder,
            )

    def _send_first(self, n: int) -> None:
        """Send the first ``n`` pending records: one alone as it is, more as one batch."""
        if n == 1:
            self._send(self._pending[0])
            return
        if self._pending[0]["op"] == "dataset":
            _log_datasets(self.client, self.run_id, self._pending[:n])
            return
        from mlflow.entities import Metric, Param, RunTag

        batch = self._pending[:n]  # no key twice (``gathered``)
        params = [Param(k, v) for e in batch for k, v in e.get("params", {}).items()]
        tags = [RunTag(k, v) for e in batch for k, v in e.get("tags", {}).items()]
        metrics = [
            Metric(k, v, e["ts"], e["step"]) for e in batch for k, v in e.get("metrics", {}).items()
        ]
        self.client.log_batch(self.run_id, metrics=metrics, params=params, tags=tags)

    def _send(self, e: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        c, run = self.client, self.run_id
        op = e["op"]
        if op == "params":
            for chunk in chunks(list(e["params"].items())):
                c.log_batch(run, params=[Param(k, v) for k, v in chunk])
        elif op == "tags":
            for chunk in chunks(list(e["tags"].items())):
                c.log_batch(run, tags=[RunTag(k, v) for k, v in chunk])
        elif op == "metrics":
            c.log_batch(
                run, metrics=[Metric(k, v, e["ts"], e["step"]) for k, v in e["metrics"].items()]
            )
        elif op == "untag":
            there = c.get_run(run).data.tags
            for k in e["keys"]:
                if k in there:  # a replay may send it twice
                    c.delete_tag(run, k)
        elif op == "text":
            c.log_text(run, e["text"], e["path"])
        elif op == "files":
            c.log_artifacts(run, str(self.folder / e["folder"]), e["path"])
        elif op == "dataset":
            _log_datasets(c, run, [e])
        elif op == "model":
            _log_model(c, run, self.folder / e["folder"], e["name"])
        elif op == "end":
            c.set_terminated(run, e["status"], end_time=e["ts"])
        elif op != "run":
            raise AblateError(f"{self._lines}: unknown record {op!r}")

    def _append(self, entry: dict[str, Any]) -> None:
        with self._lines.open("a") as f:
            f.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._count += 1

    def _mark_sent(self, n: int) -> None:
        write_atomic(self._sent_file, str(n))  # a replay never sends a record twice
        self._sent = n


def gathered(pending: list[dict[str, Any]]) -> int:
    """How many of the first ``pending`` records go to the store in one call: datasets in a row
    (``log_inputs``), or params, tags and metrics in a row (``log_batch``) within MLflow's limits
    per batch and with no key twice (a record of a key already in the batch starts the next one,
    so each key ends as if sent one by one)."""
    if pending[0]["op"] == "dataset":  # datasets in a row: one log_inputs, each dataset once
        named: set[tuple[str, str]] = set()
        for n, e in enumerate(pending):
            if e["op"] != "dataset" or (e["name"], e["digest"]) in named or n == _BATCH:
                return n
            named.add((e["name"], e["digest"]))
        return len(pending)
    seen: dict[str, set] = {"params": set(), "tags": set(), "metrics": set()}
    n = 0
    for e in pending:
        if e["op"] not in _GATHERED:
            break
        keys = {kind: set(e.get(kind, {})) for kind in seen}
        keys["metrics"] = {(k, e.get("step")) for k in keys["metrics"]}
        joined = {kind: seen[kind] | keys[kind] for kind in seen}
        clash = any(seen[kind] & keys[kind] for kind in seen)
        params_tags = max(len(joined["params"]), len(joined["tags"]))
        entities = sum(map(len, joined.values()))
        if n and (clash or params_tags > _BATCH or entities > _ENTITIES):
            break
        seen = joined
        n += 1
    return max(n, 1)


def chunks(items: list, size: int = _BATCH) -> Iterable[list]:
    """``items`` in lists of at most ``size``: MLflow's limit of params (and tags) per batch."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _log_datasets(client: MlflowClient, run_id: str, entries: list[Mapping[str, str]]) -> None:
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.http_dataset_source import HTTPDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = []
    for e in entries:
        source = e["source"]
        if source.startswith(("http://", "https://")):
            origin = HTTPDatasetSource(source)
        else:
            with warnings.catch_warnings():  # a path matches MLflow's local and file sources
                warnings.simplefilter("ignore", UserWarning)
                origin = resolve_dataset_source(source)
        dataset = MetaDataset(origin, name=e["name"], digest=e["digest"])
        context = [InputTag(MLFLOW_DATASET_CONTEXT, e["context"])]
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags=context))
    for attempt in range(5):
        try:
            client.log_inputs(run_id, datasets=inputs)
            return
        except MlflowException as exc:
            # Parallel jobs logging the same dataset race to create its row; the loser finds it
            # there when it tries again.
            if "UNIQUE" not in str(exc).upper() or attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))


def _log_model(client: MlflowClient, run_id: str, folder: Path, name: str) -> None:
    """What ``mlflow.<flavour>.log_model`` does in the store, for a model already saved: a
    LoggedModel with the run's params, named as the run's output, holding ``folder``."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model

    run = client.get_run(run_id)
    experiment = run.info.experiment_id
    # A send cut short by an outage is tried again: the model it created is taken up, not doubled
    found = client.search_logged_models(
        [experiment], filter_string=f"name = '{name}' AND source_run_id = '{run_id}'"
    )
    model = found[0] if found else None
    if model is None:
        model = client.create_logged_model(
            experiment, name=name, source_run_id=run_id, params=run.data.params
        )
    outputs = run.outputs.model_outputs if run.outputs else []
    if model.model_id not in {o.model_id for o in outputs}:
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    mlmodel = Model.load(str(folder))  # it names its logged model, as log_model's does
    mlmodel.run_id, mlmodel.model_id, mlmodel.model_uuid = run_id, model.model_id, model.model_id
    mlmodel.artifact_path = model.artifact_location
    mlmodel.save(str(folder / "MLmodel"))
    client.log_model_artifacts(model.model_id, str(folder))
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
