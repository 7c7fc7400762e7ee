"""MLflow tracking: one run per Hydra job (``conf/tracking``)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from transformers import TrainerCallback

from ablate.config import project_root
from ablate.errors import AblateError

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


def prepare(uri: str, experiment: str) -> str:
    """Create the store's schema and the experiment if missing; return the experiment id.

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
    return exp.experiment_id


class PrepareStore(Callback):
    """Hydra callback: prepare the store once, before any job of a run or sweep starts."""

    def _prepare(self, config: DictConfig) -> None:
        try:
            prepare(config.tracking.uri, config.tracking.experiment)
        except AblateError as exc:
            print(f"ablate: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None  # before any job: one line, no traceback

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._prepare(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._prepare(config)


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

    def __init__(self, run_id: str, cfg: DictConfig):
        self.id = run_id
        self.cfg = cfg

    def tags(self, tags: Mapping[str, Any]) -> None:
        mlflow.set_tags({k: str(v) for k, v in tags.items()})

    def metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def text(self, text: str, path: str) -> None:
        mlflow.log_text(text, path)

    def json(self, obj: Any, path: str) -> None:
        # compact: mlflow.log_dict indents, which triples the size of per-word prediction files
        mlflow.log_text(json.dumps(obj, separators=(",", ":")), path)


@contextmanager
def start_run(cfg: DictConfig) -> Iterator[Run]:
    """Open this job's MLflow run with params, tags and config artifacts.

    The run ends FINISHED, or FAILED (with an ``error`` tag) if the body raises; the exception
    propagates so a sweep records the job as failed and goes on with the next one.
    """
    uri = cfg.tracking.uri
    experiment_id = prepare(uri, cfg.tracking.experiment)
    mlflow.set_tracking_uri(uri)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name(cfg)) as active:
        run = Run(active.info.run_id, cfg)
        try:
            params = flatten(resolved)
            params.update(
                data=cfg.data.name, freeze=cfg.freeze.name, model=cfg.model.name, seed=cfg.seed
            )
            mlflow.log_params(params)
            run.tags({**_git(), **_hydra_info(), "started_unix": int(time.time())})
            run.tags(cfg.tracking.tags)  # the config's own (e.g. an lr search's study)
            run.text(OmegaConf.to_yaml(resolved), "config.yaml")
            if HydraConfig.initialized():
                hydra_dir = Path(HydraConfig.get().runtime.output_dir) / ".hydra"
                if hydra_dir.is_dir():
                    mlflow.log_artifacts(str(hydra_dir), ".hydra")
            yield run
        except BaseException as exc:
            mlflow.set_tag("error", f"{type(exc).__name__}: {exc}"[:5000])
            raise


class EpochLogger(TrainerCallback):
    """Logs per-epoch metrics with step = epoch (1..N).

    The Trainer's own MLflow integration steps metrics by optimiser step and logs every
    TrainingArguments field as a param, which would clash with ours; this keeps one scheme.
    """

    def __init__(self, run: Run, primary: str = "accuracy"):
        self.run = run
        self.primary = primary
        self.history: list[float] = []
        self._t0 = 0.0

    @staticmethod
    def _epoch(state) -> int:
        return int(round(state.epoch or 0))

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.run.metrics({"epoch_time_s": time.perf_counter() - self._t0}, step=self._epoch(state))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.run.metrics({"train_loss": logs["loss"]}, step=self._epoch(state))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        value = metrics[f"eval_{self.primary}"]
        self.history.append(value)
        self.run.metrics({f"dev_{self.primary}": value}, step=self._epoch(state))
