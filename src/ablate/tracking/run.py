"""One MLflow run per Hydra job (``conf/tracking``): opened with the resolved config as params and
its record of code, data and environment, ended FINISHED, FAILED (with an ``error`` tag) or
KILLED; ``Run`` is what training records through (``ablate.training.recorder.Recorder``)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from hydra.core.hydra_config import HydraConfig
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from ablate import config
from ablate.config import project_root
from ablate.tracking import procs
from ablate.tracking.history import latest_per_step
from ablate.tracking.identity import identity
from ablate.tracking.parent import sweep_parent
from ablate.tracking.store import prepare

# MLflow's system-metrics monitor announces every start and stop; its warnings still show.
logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)


def environment() -> dict[str, str]:
    """Versions, device and host: what a reader needs to reproduce a number."""
    import importlib.metadata as md
    import platform

    import torch

    info = {"python": platform.python_version()}
    for package in ("torch", "transformers", "peft", "datasets", "mlflow", "hydra-core"):
        try:
            info[package] = md.version(package)
        except md.PackageNotFoundError:
            info[package] = "absent"
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    info["host"] = socket.gethostname()
    return info


def process() -> dict[str, Any]:
    """This process as ``mark_stale_runs`` checks it: host, pid and start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": procs.started(os.getpid())}


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
            r for r in runs
            if r.data.tags.get("ablate.checkpoint_dir", "").startswith(inside + os.sep)
        ]  # fmt: skip
    return runs[0] if runs else None


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> {"a.b.c": leaf}; lists stay leaves (MLflow params are flat strings)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


# Overrides already in a run's name, or that change where it goes rather than what it computes.
_NAMED = ("data", "data.name", "data.treebank", "freeze", "freeze.name", "model", "model.name",
          "seed")  # fmt: skip


def run_name(cfg: DictConfig) -> str:
    """``{data}-{freeze}-{model}-s{seed}``, then the job's other command-line overrides that
    change what it computes (``epochs=1``, ``smoke`` for ``experiment=smoke``), so runs of two
    different configurations are told apart."""
    name = f"{cfg.data.name}-{cfg.freeze.name}-{cfg.model.name}-s{cfg.seed}"
    if not HydraConfig.initialized():
        return name
    identity_flag = config.flags("identity")
    extra = []
    for override in HydraConfig.get().overrides.task:
        key, _, value = override.lstrip("+~").partition("=")
        if (
            key in _NAMED
            or not identity_flag.get(key, True)
            or key.startswith(("hydra", "data.splits."))  # pins of the files, not what runs
        ):
            continue
        extra.append(value if "." not in key and key not in config.GROUPS else
                     f"{key.rsplit('.', 1)[-1]}={value}")  # fmt: skip
    return " ".join([name, *extra])[:250]


def _git() -> dict[str, str]:
    root = project_root()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git.commit": "unknown"}
    return {"git.commit": commit, "git.dirty": str(bool(git("status", "--porcelain")))}


def _sweep_tags() -> dict[str, str]:
    if not in_multirun():
        return {}
    hc = HydraConfig.get()
    job_num = OmegaConf.select(hc, "job.num", default=None)
    return {"hydra.sweep_dir": str(Path(hc.sweep.dir).resolve()), "hydra.job_num": str(job_num)}


def in_multirun() -> bool:
    """True inside a job of a ``--multirun`` sweep."""
    if not HydraConfig.initialized():
        return False
    return str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


class Run:
    """The MLflow run of the current job: what training records through (``Recorder``)."""

    def __init__(self, run_id: str, cfg: DictConfig, client: MlflowClient, resumed=None):
        self.id = run_id
        self.cfg = cfg
        self.client = client
        self.resumed = resumed  # the KILLED run this job continues, or None
        self._info: dict[str, Any] = {}

    def history(self, key: str) -> list[float]:
        """Values of a per-epoch metric logged so far, in epoch order: one per epoch, the latest
        (a resumed run logs again the epochs its checkpoint did not hold)."""
        return list(latest_per_step(self.client.get_metric_history(self.id, key)).values())

    def artifacts(self, folder: str, path: str) -> None:
        mlflow.log_artifacts(folder, path)

    def heartbeat(self) -> None:
        """Record that this run's process is alive (see ``mark_stale_runs``), and so its sweep."""
        now = f"{time.time():.0f}"
        mlflow.set_tag("ablate.heartbeat", now)
        if (parent := sweep_parent()) is not None:
            self.client.set_tag(parent, "ablate.heartbeat", now)

    def tags(self, tags: Mapping[str, Any]) -> None:
        mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def text(self, text: str, path: str) -> None:
        mlflow.log_text(text, path)

    def json(self, obj: Any, path: str) -> None:
        # compact: mlflow.log_dict indents, which triples the size of per-word prediction files
        mlflow.log_text(json.dumps(obj, separators=(",", ":")), path)

    def info(self, section: str, values: Mapping[str, Any]) -> None:
        """Bookkeeping a reader may want but the run page need not show (environment, data
        files, what each speed plugin applied): one section of the artifact ``run.json``."""
        self._info[section] = {**self._info.get(section, {}), **values}
        mlflow.log_text(json.dumps(self._info, indent=1, default=str), RUN_INFO)

    def dataset(self, name: str, source: str, sha256: str, context: str) -> None:
        """Log a dataset the run used (``mlflow.log_input``): its name, where it comes from (a
        URL or a local path), its content's sha256 and its role (train, dev, test)."""
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.http_dataset_source import HTTPDatasetSource
        from mlflow.data.meta_dataset import MetaDataset

        if source.startswith(("http://", "https://")):
            origin = HTTPDatasetSource(source)
        else:
            with warnings.catch_warnings():  # a path matches MLflow's local and file sources alike
                warnings.simplefilter("ignore", UserWarning)
                origin = resolve_dataset_source(source)
        # MLflow keeps digests of at most 36 characters: the first 32 hex digits (128 bits)
        dataset = MetaDataset(origin, name=name, digest=sha256[:32])
        for attempt in range(5):
            try:
                mlflow.log_input(dataset, context=context)
                return
            except MlflowException as exc:
                # Parallel jobs logging the same dataset race to create its row; the loser finds
                # it there when it tries again.
                if "UNIQUE" not in str(exc).upper() or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))


RUN_INFO = "run.json"
# What schedulers send to stop a job: SLURM (scancel, time limit, preemption: TERM, or USR1/USR2
# as `--signal` asks), Kubernetes, systemd and docker (TERM). Ctrl-C stays a KeyboardInterrupt.
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, name)
)


class Interrupted(BaseException):
    """A stop signal, raised where the job was so that the run ends KILLED with its last epoch
    checkpoint (a BaseException, as KeyboardInterrupt: nothing may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _stop_signals() -> Iterator[dict[int, Any]]:
    """Raise ``Interrupted`` on a stop signal while the run is open; yields the handlers that
    were installed before (submitit's requeue, say), to call once the run is closed."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return

    def interrupt(signum, frame):
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield previous
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _after_stop(signum: int, previous: dict[int, Any]) -> None:
    """The run is closed KILLED: hand the signal to what was there before (submitit checkpoints
    and requeues the job), else end the process as the signal would have."""
    handler = previous.get(signum)
    if callable(handler):
        handler(signum, None)
    raise SystemExit(128 + signum)


def finished_twin(cfg: DictConfig):
    """The newest FINISHED run whose config is identical to ``cfg`` (see ``identity``), or None."""
    experiment_id = prepare(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.stale_after_min)
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    return latest_run(client, experiment_id, identity(cfg), "FINISHED")


@contextmanager
def start_run(cfg: DictConfig, data_sha256: Mapping[str, str] | None = None) -> Iterator[Run]:
    """Open this job's MLflow run: the resolved config as params, a few tags, ``config.yaml``
    and ``.hydra/`` as artifacts, system metrics while it runs; in a sweep, a child of the
    sweep's run.

    The run ends FINISHED, or FAILED (with an ``error`` tag) if the body raises, or KILLED on
    Ctrl-C; the exception propagates so a sweep records the job as failed and goes on with the
    next one. With ``trainer.resume=true`` the newest KILLED run of the same config is reopened
    (``Run.resumed``) instead of starting a new one. ``data_sha256``: the split files' hashes,
    when the caller has them (else the identity locates the files again).
    """
    uri = cfg.tracking.uri
    experiment_id = prepare(uri, cfg.tracking.experiment, cfg.tracking.stale_after_min)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    ident = identity(cfg, data_sha256)
    folder = requeued_from()
    resumed = latest_run(client, experiment_id, ident, "KILLED", folder) if folder else None
    if not resumed and cfg.trainer.resume:
        resumed = latest_run(client, experiment_id, ident, "KILLED")
    this_process = {
        "ablate.process": json.dumps(process()),
        "ablate.heartbeat": f"{time.time():.0f}",
    }
    if resumed is not None:
        # before it is RUNNING again: a job starting meanwhile must not take the dead process's
        # pid, still in its tags, for this run's and mark it KILLED
        for key, value in this_process.items():
            client.set_tag(resumed.info.run_id, key, value)
        opened = mlflow.start_run(run_id=resumed.info.run_id, log_system_metrics=True)
    else:
        opened = mlflow.start_run(
            experiment_id=experiment_id, run_name=run_name(cfg), log_system_metrics=True,
            parent_run_id=sweep_parent(),
        )  # fmt: skip
    with opened as active, _stop_signals() as previous:
        run = Run(active.info.run_id, cfg, client, resumed)
        try:
            if resumed is None:  # a reopened run keeps its params (re-logging one would raise)
                resolved = OmegaConf.to_container(cfg, resolve=True)
                mlflow.log_params(flatten(resolved))
                run.text(OmegaConf.to_yaml(resolved), "config.yaml")
                if HydraConfig.initialized():
                    hydra_dir = Path(HydraConfig.get().runtime.output_dir) / ".hydra"
                    if hydra_dir.is_dir():
                        mlflow.log_artifacts(str(hydra_dir), ".hydra")
            else:
                run.tags({"ablate.resumed": "true"})
            env = environment()
            run.tags({**_git(), "device": env["device"], **_sweep_tags()})
            run.tags({"ablate.identity": ident, **this_process})
            run.tags(cfg.tracking.tags)  # the config's own (e.g. an lr search's study)
            output = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None
            run.info("environment", {**env, "output_dir": output})
            yield run
        except (KeyboardInterrupt, Interrupted) as exc:
            # interrupted, not broken: resumable from its last epoch checkpoint
            mlflow.set_tag("error", type(exc).__name__ if isinstance(exc, KeyboardInterrupt)
                           else f"stopped by {exc}")  # fmt: skip
            mlflow.end_run("KILLED")
            if isinstance(exc, KeyboardInterrupt):
                raise
            _after_stop(exc.signum, previous)
        except BaseException as exc:
            mlflow.set_tag("error", f"{type(exc).__name__}: {exc}"[:5000])
            raise


def requeued_from() -> str | None:
    """This job's folder: a job that finds there the checkpoint of a KILLED run of its own
    config continues that run (a preempted or timed-out SLURM job requeued by submitit runs
    again in the same folder); None outside Hydra."""
    return HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else None
