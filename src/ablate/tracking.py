"""MLflow tracking: one run per Hydra job (``conf/tracking``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from transformers import TrainerCallback

from ablate import data, procs
from ablate import model as model_lib
from ablate.config import project_root
from ablate.errors import AblateError
from ablate.report import latest_per_step

# Offline machines: don't let MLflow try to phone home.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402  (after the environment it reads at import)
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail at once, not after an hour of training, if the store can't be used.

    MLflow's HTTP client retries with backoff for minutes; a short health probe answers first.
    """
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            raise AblateError(f"tracking.uri={uri}: no MLflow server answers ({exc})") from exc
        raise AblateError(f"tracking.uri={uri}: server health check failed")
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AblateError(f"tracking.uri={uri}: cannot create {folder} ({exc})") from exc
        if not os.access(folder, os.W_OK):
            raise AblateError(f"tracking.uri={uri}: {folder} is not writable")


def artifact_root(uri: str) -> str | None:
    """``mlartifacts/`` beside a sqlite store; None (the server's choice) for other stores.

    Without it MLflow puts a sqlite store's artifacts in ``./mlruns`` of whichever process
    created the experiment, so runs from different folders scatter their artifacts.
    """
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
    return None


def prepare(uri: str, experiment: str, stale_after_min: float | None = None) -> str:
    """Create the store's schema and the experiment if missing; return the experiment id.

    With ``stale_after_min``, RUNNING runs whose process died are marked KILLED first.

    Called once before the jobs of a sweep start (``PrepareStore``): parallel jobs racing to create
    tables or the experiment corrupt runs silently (BRIEF.md §5).
    """
    check_reachable(uri)
    client = MlflowClient(tracking_uri=uri)
    try:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            try:
                return client.create_experiment(experiment, artifact_location=artifact_root(uri))
            except MlflowException:  # another process created it first
                exp = client.get_experiment_by_name(experiment)
    except MlflowException as exc:
        raise AblateError(f"tracking.uri={uri}: the MLflow store is not usable: {exc}") from exc
    if exp.lifecycle_stage == "deleted":
        raise AblateError(
            f"MLflow experiment {experiment!r} in {uri} is deleted; restore it "
            f"(mlflow experiments restore --experiment-id {exp.experiment_id}) or choose "
            f"another tracking.experiment"
        )
    if stale_after_min is not None:
        mark_stale_runs(client, exp.experiment_id, stale_after_min * 60)
    return exp.experiment_id


class PrepareStore(Callback):
    """Hydra callback: prepare the store once, before any job of a run or sweep starts."""

    def _prepare(self, config: DictConfig) -> None:
        try:
            prepare(
                config.tracking.uri, config.tracking.experiment, config.tracking.stale_after_min
            )
        except AblateError as exc:
            print(f"ablate: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None  # before any job: one line, no traceback

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._prepare(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._prepare(config)


# Keys that say where a run goes or how it is scheduled, not what it computes.
NOT_IDENTITY = (
    "tracking", "skip_finished", "trainer.resume", "data.root",
    "data.tokenized_cache", "data.tokenized_cache_dir", "trainer.sorted_eval", "trainer.pin_memory",
    "trainer.cache_frozen_eval",
)  # fmt: skip


def identity(cfg: DictConfig) -> str:
    """sha256 of the resolved config without where-and-how keys, plus the sha256 of each data
    split file and ``data.extra_test`` file: equal runs have equal identity.

    ``data.root`` is left out and the files' content counts instead: the same files elsewhere are
    the same run, and other files under the same config (an unpinned treebank folder, a user's
    slice) are not. Likewise a local model folder counts by its content
    (``model.source_fingerprint``), not its path. The caches and the evaluation order are left out
    because they give the same numbers (tested).
    """
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["model"]["name_or_path"] = model_lib.source_fingerprint(cfg.model)
    with contextlib.suppress(AblateError):  # fit raises it again, inside the run (FAILED, tagged)
        extra = enumerate(data.extra_test_paths(cfg.data))
        resolved["data_sha256"] = {
            **data.locate(cfg.data).sha256,
            **{f"extra_test.{i}": data.sha256_of(path) for i, path in extra},
        }
    for dotted in NOT_IDENTITY:
        *parents, leaf = dotted.split(".")
        node = resolved
        for key in parents:
            node = node.get(key, {})
        node.pop(leaf, None)
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()


def environment() -> dict[str, str]:
    """Versions and device: what a reader needs to reproduce a number."""
    import importlib.metadata as md
    import platform

    import torch

    tags = {"versions.python": platform.python_version()}
    for package in ("torch", "transformers", "peft", "mlflow", "hydra-core", "accelerate"):
        try:
            tags[f"versions.{package}"] = md.version(package)
        except md.PackageNotFoundError:
            tags[f"versions.{package}"] = "absent"
    tags["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    tags["host"] = socket.gethostname()
    return tags


def mark_stale_runs(client: MlflowClient, experiment_id: str, stale_after_s: float) -> list[str]:
    """Mark KILLED the RUNNING runs whose process died; return their ids.

    Dead means: started on this host by a process that no longer exists (or whose pid another
    process now has: the start time differs), or (any host) no heartbeat for ``stale_after_s``
    seconds. A SIGKILL or a preemption leaves no other trace. A run whose very process is still
    alive on this host is never marked, however long it has been quiet (a long evaluation).
    """
    host, now, killed = socket.gethostname(), time.time(), []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'"):
        tags = run.data.tags
        pid = int(tags.get("ablate.pid", "0") or 0)
        beat = float(tags.get("ablate.heartbeat", run.info.start_time / 1000))
        started = tags.get("ablate.pid_started")
        here = tags.get("host") == host and pid
        if here and not procs.same(pid, started):
            reason = f"process {pid} on {host} is gone"
        elif here and started is not None:
            continue  # that very process runs (same pid and start time)
        elif now - beat > stale_after_s:
            reason = f"no heartbeat for {(now - beat) / 60:.0f} min"
        else:
            continue
        client.set_tag(run.info.run_id, "ablate.killed_reason", reason)
        client.set_terminated(run.info.run_id, status="KILLED")
        killed.append(run.info.run_id)
    return killed


def latest_run(client: MlflowClient, experiment_id: str, ident: str, status: str):
    """The newest run of this experiment with identity ``ident`` and ``status``, or None."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`ablate.identity` = '{ident}' and attributes.status = '{status}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
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


def run_name(cfg: DictConfig) -> str:
    """``{data}-{freeze}-{model}-s{seed}``."""
    return f"{cfg.data.name}-{cfg.freeze.name}-{cfg.model.name}-s{cfg.seed}"


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


def _hydra_info() -> dict[str, str]:
    if not HydraConfig.initialized():
        return {}
    hc = HydraConfig.get()
    tags = {"hydra.output_dir": hc.runtime.output_dir}
    job_num = OmegaConf.select(hc, "job.num", default=None)
    if in_multirun():
        tags.update(
            {"hydra.sweep_dir": str(Path(hc.sweep.dir).resolve()), "hydra.job_num": str(job_num)}
        )
    return tags


def in_multirun() -> bool:
    """True inside a job of a ``--multirun`` sweep."""
    if not HydraConfig.initialized():
        return False
    return str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Run:
    """The MLflow run of the current job."""

    def __init__(self, run_id: str, cfg: DictConfig, client: MlflowClient, resumed=None):
        self.id = run_id
        self.cfg = cfg
        self.client = client
        self.resumed = resumed  # the KILLED run this job continues, or None

    def history(self, key: str) -> list[float]:
        """Values of a per-epoch metric logged so far, in epoch order: one per epoch, the latest
        (a resumed run logs again the epochs its checkpoint did not hold)."""
        return list(latest_per_step(self.client.get_metric_history(self.id, key)).values())

    def artifacts(self, folder: str, path: str) -> None:
        mlflow.log_artifacts(folder, path)

    def heartbeat(self) -> None:
        """Record that this run's process is alive (see ``mark_stale_runs``)."""
        mlflow.set_tag("ablate.heartbeat", f"{time.time():.0f}")

    def tags(self, tags: Mapping[str, Any]) -> None:
        mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def text(self, text: str, path: str) -> None:
        mlflow.log_text(text, path)

    def json(self, obj: Any, path: str) -> None:
        # compact: mlflow.log_dict indents, which triples the size of per-word prediction files
        mlflow.log_text(json.dumps(obj, separators=(",", ":")), path)


def finished_twin(cfg: DictConfig):
    """The newest FINISHED run whose config is identical to ``cfg`` (see ``identity``), or None."""
    experiment_id = prepare(cfg.tracking.uri, cfg.tracking.experiment, cfg.tracking.stale_after_min)
    client = MlflowClient(tracking_uri=cfg.tracking.uri)
    return latest_run(client, experiment_id, identity(cfg), "FINISHED")


@contextmanager
def start_run(cfg: DictConfig) -> Iterator[Run]:
    """Open this job's MLflow run with params, tags and config artifacts.

    The run ends FINISHED, or FAILED (with an ``error`` tag) if the body raises, or KILLED on
    Ctrl-C; the exception propagates so a sweep records the job as failed and goes on with the
    next one. With ``trainer.resume=true`` the newest KILLED run of the same config is reopened
    (``Run.resumed``) instead of starting a new one.
    """
    uri = cfg.tracking.uri
    experiment_id = prepare(uri, cfg.tracking.experiment, cfg.tracking.stale_after_min)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(tracking_uri=uri)
    ident = identity(cfg)
    resumed = latest_run(client, experiment_id, ident, "KILLED") if cfg.trainer.resume else None
    this_process = {"ablate.pid": str(os.getpid()), "ablate.heartbeat": f"{time.time():.0f}"}
    if (started := procs.started(os.getpid())) is not None:
        this_process["ablate.pid_started"] = started
    if resumed is not None:
        # before it is RUNNING again: a job starting meanwhile must not take the dead process's
        # pid, still in its tags, for this run's and mark it KILLED
        for key, value in this_process.items():
            client.set_tag(resumed.info.run_id, key, value)
        opened = mlflow.start_run(run_id=resumed.info.run_id)
    else:
        opened = mlflow.start_run(experiment_id=experiment_id, run_name=run_name(cfg))
    with opened as active:
        run = Run(active.info.run_id, cfg, client, resumed)
        try:
            if resumed is None:  # a reopened run keeps its params (re-logging one would raise)
                resolved = OmegaConf.to_container(cfg, resolve=True)
                params = flatten(resolved)
                params.update(
                    data=cfg.data.name, freeze=cfg.freeze.name, model=cfg.model.name, seed=cfg.seed
                )
                mlflow.log_params(params)
                run.text(OmegaConf.to_yaml(resolved), "config.yaml")
                if HydraConfig.initialized():
                    hydra_dir = Path(HydraConfig.get().runtime.output_dir) / ".hydra"
                    if hydra_dir.is_dir():
                        mlflow.log_artifacts(str(hydra_dir), ".hydra")
            else:
                run.tags({"ablate.resumed": "true"})
            run.tags({**_git(), **_hydra_info(), **environment()})
            run.tags({"ablate.identity": ident, **this_process})
            run.tags(cfg.tracking.tags)  # the config's own (e.g. an lr search's study)
            run.heartbeat()
            yield run
        except KeyboardInterrupt:
            mlflow.set_tag("error", "KeyboardInterrupt")
            mlflow.end_run("KILLED")  # interrupted, not broken: resumable like a preempted run
            raise
        except BaseException as exc:
            mlflow.set_tag("error", f"{type(exc).__name__}: {exc}"[:5000])
            raise


class EpochLogger(TrainerCallback):
    """Logs per-epoch metrics with step = epoch (1..N).

    The Trainer's own MLflow integration steps metrics by optimiser step and logs every
    TrainingArguments field as a param, which would clash with ours; this keeps one scheme.
    """

    HEARTBEAT_S = 60.0

    def __init__(self, run: Run, primary: str = "accuracy", also: Sequence[str] = ()):
        self.run = run
        self.primary = primary
        self.also = tuple(also)  # other dev metrics logged per epoch (not tracked for best_dev_*)
        # a resumed run's earlier epochs count for best_dev_*
        self.history: list[float] = run.history(f"dev_{primary}") if run.resumed else []
        self._t0 = 0.0
        self._beat = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if time.monotonic() - self._beat > self.HEARTBEAT_S:
            self._beat = time.monotonic()
            self.run.heartbeat()

    @staticmethod
    def _epoch(state) -> int:
        return int(round(state.epoch or 0))

    def on_train_begin(self, args, state, control, **kwargs):
        # A run killed after an epoch's dev score was logged but before its checkpoint was saved
        # trains that epoch again: keep only the epochs the checkpoint holds.
        del self.history[self._epoch(state) :]

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.run.metrics({"epoch_time_s": time.perf_counter() - self._t0}, step=self._epoch(state))
        self.run.heartbeat()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.run.metrics({"train_loss": logs["loss"]}, step=self._epoch(state))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        value = metrics[f"eval_{self.primary}"]
        self.history.append(value)
        logged = {f"dev_{self.primary}": value}
        logged.update(
            {f"dev_{k}": metrics[f"eval_{k}"] for k in self.also if f"eval_{k}" in metrics}
        )
        self.run.metrics(logged, step=self._epoch(state))
