"""One MLflow run per Hydra job (``conf/tracking``): opened with the resolved config as params and
its record of code, data and environment, ended FINISHED, FAILED (with an ``error`` tag) or
KILLED; ``Run`` is what training records through (``ablate.tracking.recorder.Recorder``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME
from omegaconf import OmegaConf

from ablate.errors import AblateError
from ablate.tracking import ui_links
from ablate.tracking.identity import identity
from ablate.tracking.journal import FOLDER as JOURNAL
from ablate.tracking.journal import Journal
from ablate.tracking.params import (
    CPU_TAG,
    OPTION_KEYS_TAG,
    RESUMED_TAG,
    flatten,
    option_keys,
    selected,
)
from ablate.tracking.parent import REUSED, adopt, in_multirun, recorded, sweep_parent
from ablate.tracking.provenance import environment, git_tags, process, run_name, sweep_tags
from ablate.tracking.signals import Interrupted, after_stop, stop_signals
from ablate.tracking.store import prepare

if TYPE_CHECKING:
    from ablate.config import TrainCore

log = logging.getLogger("ablate")
# MLflow's system-metrics monitor announces every start and stop; its warnings still show.
logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
# MLflow's HTTP retries warn once a try while a server is away; the journal says it in one line.
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def latest_run(
    client: MlflowClient, experiment_id: str, ident: str, status: str, folder: str | None = None
):
    """The newest run of this experiment with identity ``ident`` and ``status`` (with
    ``folder``: whose checkpoints were kept in that job folder), or None."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`ablate.identity` = '{ident}' and attributes.status = '{status}'",
        order_by=["attributes.start_time DESC"],
    )
    if folder is not None:
        inside = str(Path(folder).resolve())
        runs = [
            r
            for r in runs
            if r.data.tags.get("ablate.checkpoint_dir", "").startswith(inside + os.sep)
        ]
    return runs[0] if runs else None


def reused(twin) -> None:
    """In a sweep, record on its run that this job reused the FINISHED run ``twin``
    (``skip_finished``): the sweep's report and status count it as one of its runs."""
    if not in_multirun() or (found := recorded(HydraConfig.get().sweep.dir)) is None:
        return
    job = OmegaConf.select(HydraConfig.get(), "job.num", default=None)
    MlflowClient(tracking_uri=found["uri"]).set_tag(
        found["run_id"], f"{REUSED}{job}", twin.info.run_id
    )


class Run:
    """The MLflow run of the current job: what training records through (``Recorder``).

    Every record goes through the run's ``Journal`` (its job folder), so a tracking server
    that goes away for a while loses nothing. Params, tags and metrics reach the store in
    batches: with the next record of another kind (an artifact, a dataset), at a heartbeat (each
    epoch's end, and each minute of an epoch) and at the run's end."""

    def __init__(self, run_id: str, cfg: TrainCore, journal: Journal, resumed=None):
        self.id = run_id
        self.cfg = cfg
        self.journal = journal
        self.resumed = resumed  # the KILLED run this job continues, or None
        self.experiment_id: str | None = None
        self._info: dict[str, Any] = {}
        self._monitor = None
        self.tagged: dict[str, str] = {}  # the tags this job set (its end's line reads them)

    def artifacts(self, folder: str, path: str) -> None:
        self.journal.files(folder, path)

    def heartbeat(self) -> None:
        """Record that this run's process is alive (see ``mark_stale_runs``), and so its sweep."""
        now = f"{time.time():.0f}"
        self.journal.tags({"ablate.heartbeat": now})
        self.journal.flush()  # with what waits for a batch: the store is current at each beat
        parent = sweep_parent()
        if parent is not None and self.journal.down_since is None:
            with contextlib.suppress(MlflowException):  # the sweep's own beat, not this record
                self.journal.client.set_tag(parent, "ablate.heartbeat", now)

    def tags(self, tags: Mapping[str, Any]) -> None:
        self.tagged.update({k: str(v) for k, v in tags.items()})
        self.journal.tags(tags)

    def model(self, folder: str, name: str) -> None:
        """Log the saved model in ``folder`` as the run's logged model ``name``."""
        self.journal.model(folder, name)

    def metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.journal.metrics(metrics, step)
        self.system_metrics()

    def text(self, text: str, path: str) -> None:
        self.journal.text(text, path)

    def json(self, obj: Any, path: str) -> None:
        # compact: mlflow.log_dict indents, which triples the size of per-word prediction files
        self.text(json.dumps(obj, separators=(",", ":")), path)

    def info(self, section: str, values: Mapping[str, Any]) -> None:
        """Bookkeeping a reader may want but the run page need not show (environment, data
        files, what each speed plugin applied): one section of the artifact ``run.json``."""
        self._info[section] = {**self._info.get(section, {}), **values}
        self.text(json.dumps(self._info, indent=1, default=str), RUN_INFO)

    def dataset(self, name: str, source: str, sha256: str, context: str) -> None:
        """Log a dataset the run used (``mlflow.log_input``): its name, where it comes from (a
        URL or a local path), its content's sha256 and its role (train, dev, test)."""
        # MLflow keeps digests of at most 36 characters: the first 32 hex digits (128 bits)
        self.journal.dataset(name, source, sha256[:32], context)

    def system_metrics(self, stop: bool = False) -> None:
        """MLflow's system-metrics monitor: started, restarted once the server is back (it
        ends itself when a request fails), or with ``stop`` stopped."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = self._monitor
        if stop:
            if monitor is not None:
                # finish() joins the monitor, which may be inside MLflow's minutes of retries of
                # a request sent while the server was away: give it seconds, not minutes
                ending = threading.Thread(target=monitor.finish, daemon=True)
                ending.start()
                ending.join(timeout=10)
            self._monitor = None
            return
        alive = monitor is not None and monitor._process is not None and monitor._process.is_alive()
        if not alive and self.journal.down_since is None:
            self._monitor = SystemMetricsMonitor(
                self.id,
                resume_logging=monitor is not None or self.resumed is not None,
                tracking_uri=self.journal.uri,
            )
            self._monitor.start()

    def end(self, status: str, wait_min: float) -> None:
        """Record the run's end and send everything, waiting up to ``wait_min`` for a server
        that went away; the journal is removed once all is in the store."""
        self.journal.end(status)
        self.journal.wait_and_flush(wait_min)  # raises, the journal kept, if it never answers
        self.system_metrics(stop=True)
        self.journal.remove()


RUN_INFO = "run.json"
# Tags that tell a live run from a dead one: its process and its last heartbeat.
LIVENESS = ("ablate.process", "ablate.heartbeat")


def finished_twin(cfg: TrainCore):
    """The newest FINISHED run whose config is identical to ``cfg`` (see ``identity``), or None."""
    experiment_id = prepare(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.stale_after_min)
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    return latest_run(client, experiment_id, identity(cfg), "FINISHED")


@contextmanager
def start_run(
    cfg: TrainCore,
    data_sha256: Mapping[str, str] | None = None,
    strategy_keys: Iterable[str] | None = None,
    resumable: Callable[[Any], bool] | None = None,
) -> Iterator[Run]:
    """Open this job's MLflow run: the resolved config as params, a few tags, ``config.yaml``
    and ``.hydra/`` as artifacts, system metrics while it runs; in a sweep, a child of the
    sweep's run.

    The run ends FINISHED, or FAILED (with an ``error`` tag) if the body raises, or KILLED on
    Ctrl-C or a stop signal; the exception propagates so a sweep records the job as failed and
    goes on with the next one. With ``trainer.resume=true`` the newest KILLED run of the same
    config is reopened (``Run.resumed``) instead of starting a new one. ``data_sha256``: the
    split files' hashes, when the caller has them (else the identity locates the files again).
    ``strategy_keys``: the ``freeze`` keys the run's strategy reads (its params leave the others
    out; None keeps them all). ``resumable(run)``: whether a KILLED run left something to resume
    from; one that did not (killed in its first epoch) is started over as a new run, and the
    KILLED one deleted (MLflow can delete a run, not a metric). Its record is journaled in the
    job folder (``tracking.outage_min``, ``ablate.tracking.replay``).
    """
    uri = cfg.tracking.uri
    experiment_id = prepare(uri, cfg.tracking.experiment, cfg.tracking.stale_after_min)
    client = MlflowClient(tracking_uri=uri)
    ident = identity(cfg, data_sha256)
    this_process = dict(zip(LIVENESS, (json.dumps(process()), f"{time.time():.0f}"), strict=True))
    run_id, resumed, started_over = _open(
        client, experiment_id, cfg, ident, resumable, this_process
    )
    with contextlib.suppress(MlflowException):  # a view to open, not the run's record
        ui_links.set_view(client, experiment_id, cfg.data.task)
    # params, tags and metrics gathered into one batch until the next other record or beat
    run = Run(run_id, cfg, Journal(journal_folder(run_id), uri, run_id, gather=True), resumed)
    run.experiment_id = experiment_id
    run.system_metrics()
    wait = cfg.tracking.outage_min
    with stop_signals() as previous:
        try:
            _record_start(run, cfg, strategy_keys, ident, {**started_over, **this_process})
            yield run
        except (KeyboardInterrupt, Interrupted) as exc:
            # interrupted, not broken: resumable from its last epoch checkpoint
            run.tags(
                {
                    "error": type(exc).__name__
                    if isinstance(exc, KeyboardInterrupt)
                    else f"stopped by {exc}"
                }
            )
            _end_keeping(run, "KILLED", 0)  # seconds count: a scheduler's SIGKILL follows
            if isinstance(exc, KeyboardInterrupt):
                raise
            after_stop(exc.signum, previous)
        except BaseException as exc:
            run.tags({"error": f"{type(exc).__name__}: {exc}"[:5000]})
            _end_keeping(run, "FAILED", wait)
            raise
        else:
            done = list(LIVENESS)  # only a RUNNING run needs them (mark_stale_runs)
            if resumed is not None and "error" in resumed.data.tags:  # why it stopped, before
                done.append("error")
            run.journal.untag(done)
            run.end("FINISHED", wait)


def _open(client, experiment_id: str, cfg: TrainCore, ident: str, resumable, this_process):
    """The run this job records into: the KILLED run of the same config it resumes (requeued
    into its job folder, or ``trainer.resume``; one with nothing to resume from is deleted and
    started over), else a new one (in a sweep, the sweep's child). Returns its id, the resumed
    run (or None) and the tag naming a run it started over."""
    from mlflow.tracking.context import registry as context

    folder = requeued_from()
    resumed = latest_run(client, experiment_id, ident, "KILLED", folder) if folder else None
    if not resumed and cfg.trainer.resume:
        resumed = latest_run(client, experiment_id, ident, "KILLED")
    started_over = {}
    if resumed is not None and resumable is not None and not resumable(resumed):
        old = resumed.info.run_id
        log.warning(
            "run %s was KILLED before its first epoch checkpoint: nothing to resume, so it starts "
            "over as a new run (the KILLED one is deleted; mlflow runs restore --run-id %s "
            "brings it back)",
            old,
            old,
        )
        client.delete_run(old)
        resumed, started_over = None, {"ablate.started_over": old}
    if resumed is not None:
        run_id = resumed.info.run_id
        # before it is RUNNING again: a job starting meanwhile must not take the dead process's
        # pid, still in its tags, for this run's and mark it KILLED
        for key, value in this_process.items():
            client.set_tag(run_id, key, value)
        adopt(client, resumed)  # a later sweep's job: that sweep's child now
        client.update_run(run_id, status="RUNNING")
        return run_id, resumed, started_over
    if (twin := latest_run(client, experiment_id, ident, "FINISHED")) is not None:
        log.info(  # skip_finished=false; the report takes the newer of the two
            "an identical config already FINISHED as run %s (%s); training it again as a "
            "second run, which the report takes in its place (skip_finished=true reuses it)",
            twin.info.run_name,
            twin.info.run_id,
        )
    tags = {MLFLOW_RUN_NAME: run_name(cfg)}
    if (parent := sweep_parent()) is not None:
        tags[MLFLOW_PARENT_RUN_ID] = parent
    # the tags mlflow.start_run adds (source, user, git), without its process-global state
    run_id = client.create_run(experiment_id, tags=context.resolve_tags(tags)).info.run_id
    return run_id, None, started_over


def _record_start(run: Run, cfg: TrainCore, strategy_keys, ident: str, tags: dict) -> None:
    """What a run records as it starts: a new run its params (those its strategy reads, with
    ``strategy_keys``), ``config.yaml`` and ``.hydra/``, a reopened one that it resumed; then
    the tags of its code, machine, sweep, identity and process (``tags``), the config's own, and
    its environment."""
    if run.resumed is None:  # a reopened run keeps its params (re-logging one would raise)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        run.journal.params(
            flatten(resolved) if strategy_keys is None else selected(cfg, strategy_keys, _named())
        )
        run.text(OmegaConf.to_yaml(resolved), "config.yaml")
        if HydraConfig.initialized():
            hydra_dir = Path(HydraConfig.get().runtime.output_dir) / ".hydra"
            if hydra_dir.is_dir():
                run.artifacts(str(hydra_dir), ".hydra")
    else:
        run.tags({RESUMED_TAG: "true"})
    env = environment()
    run.tags({**git_tags(), "device": env["device"], CPU_TAG: env["cpu"], **sweep_tags()})
    own = ",".join(sorted(option_keys(cfg.freeze.name))) if "name" in cfg.freeze else ""
    run.tags({"ablate.identity": ident, OPTION_KEYS_TAG: own, **tags})
    run.tags(cfg.tracking.tags)  # the config's own (e.g. an lr study trial's study=<name>)
    output = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None
    run.info("environment", {**env, "output_dir": output})


def _end_keeping(run: Run, status: str, wait_min: float) -> None:
    """End a run that is already failing: a server that never answers is reported in the log,
    the journal kept, and the run's own error goes on."""
    try:
        run.end(status, wait_min)
    except (AblateError, MlflowException) as exc:  # a store that refuses a record, too
        log.error("%s", exc)


def _named() -> list[str]:
    """The keys this job's command line sets (``+``/``~`` aside)."""
    if not HydraConfig.initialized():
        return []
    return [o.lstrip("+~").partition("=")[0] for o in HydraConfig.get().overrides.task]


def journal_folder(run_id: str) -> Path:
    """Where a run's journal lives: its job folder (``mlflow_journal/``; Hydra's output folder),
    else a temporary one. A journal another run left there is moved aside, not mixed in."""
    if not HydraConfig.initialized():
        return Path(tempfile.mkdtemp(prefix=f"ablate-{JOURNAL}-"))  # removed with the journal
    folder = Path(HydraConfig.get().runtime.output_dir) / JOURNAL
    head = folder / "journal.jsonl"
    if head.is_file() and json.loads(head.open().readline()).get("run_id") != run_id:
        folder.rename(folder.with_name(f"{JOURNAL}.{time.time():.0f}"))
    return folder


def requeued_from() -> str | None:
    """This job's folder: a job that finds there the checkpoint of a KILLED run of its own
    config continues that run (a preempted or timed-out SLURM job requeued by submitit runs
    again in the same folder); None outside Hydra."""
    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None
