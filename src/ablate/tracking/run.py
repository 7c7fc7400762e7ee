"""One MLflow run per Hydra job (``conf/tracking``): opened with the resolved config as params and
its record of code, data and environment, ended FINISHED, FAILED (with an ``error`` tag) or
KILLED; ``Run`` is what training records through (``ablate.training.recorder.Recorder``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from hydra.core.hydra_config import HydraConfig
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from ablate.config import project_root
from ablate.tracking import procs
from ablate.tracking.history import latest_per_step
from ablate.tracking.identity import identity
from ablate.tracking.store import prepare


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
def start_run(cfg: DictConfig, data_sha256: Mapping[str, str] | None = None) -> Iterator[Run]:
    """Open this job's MLflow run with params, tags and config artifacts.

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
