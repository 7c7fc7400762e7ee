"""Preloaded workers for a ``--multirun`` with the joblib launcher (``hydra/launcher=joblib``).

The sweep (``ablate.sweep``) starts the launcher's workers as its first step (``warm``), and each
imports the training stack (torch, transformers, MLflow, ablate's training modules) while the
sweep still prepares its store and its run; joblib's loky executor keeps those workers, so every
job of the sweep runs in a process that imported them once. When the last job has ended the
workers are told to exit (``release``) while the sweep writes its report, instead of at the
command's exit. Each preloaded worker leaves ``<sweep dir>/.workers/<token>-<pid>.json``: what it
imported, in how many seconds, and the sweep's jobs it ran. Other launchers (the default, serial
one; SLURM) are left as they are.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ablate.fileio import write_atomic

FOLDER = ".workers"
# What a job imports first; a model's own modules load when the job builds it.
PRELOAD = (
    "torch", "mlflow", "transformers", "ablate.tracking.run", "ablate.strategies.peft_methods",
    "ablate.training.prepare", "ablate.training.fit",
)  # fmt: skip
# Loaded on a job's first use where installed: the sqlite store's migrations check (alembic),
# the task's per-label report (scikit-learn), the run's git tags.
LATER = ("mlflow.store.tracking.sqlalchemy_store", "sklearn.metrics", "git")
HOLD_S = 60.0  # at most this long a worker waits for the others to take theirs


def _joblib_args(launcher: DictConfig) -> dict[str, Any] | None:
    """What Hydra's joblib launcher passes to ``joblib.Parallel``; None for another launcher."""
    if not str(launcher.get("_target_", "")).endswith("JoblibLauncher"):
        return None
    from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg

    args = OmegaConf.to_container(launcher, resolve=True)
    args.pop("_target_", None)
    args["backend"] = "loky"  # as the launcher sets it
    process_joblib_cfg(args)
    return args


# The executor whose workers this process preloaded: a module global, as the sweep's callback
# object travels to the workers with Hydra's context and an executor cannot be pickled.
_started = None
_record: Path | None = None  # in a preloaded worker: its record, which lists the jobs it runs


def release(kill: bool = False) -> None:
    """Let the preloaded workers exit now (the jobs are done), without waiting for them;
    ``kill``: at once, where no job has run (the sweep stopped before its first)."""
    global _started
    if _started is not None:
        _started.shutdown(wait=False, kill_workers=kill)
        _started = None


def warm(config: DictConfig) -> bool:
    """Start a joblib sweep's workers and their imports, returning at once; False where the
    launcher is not joblib's or runs one job at a time (its jobs then run in this process)."""
    global _started
    args = _joblib_args(config.hydra.launcher)
    if args is None:
        return False
    from joblib import Parallel

    # The executor joblib's own Parallel(**args) builds, which the launcher's Parallel(**args)
    # then reuses (loky keeps a pool whose arguments match): a public way to submit to it
    # without waiting for the results does not exist.
    parallel = Parallel(**args)
    workers = parallel._initialize_backend()
    executor = getattr(parallel._backend, "_workers", None)
    if executor is None or workers <= 1:
        return False
    folder = str(Path(config.hydra.sweep.dir).resolve() / FOLDER)
    token, policy = uuid.uuid4().hex[:8], config.trainer.omp_wait_policy
    for _ in range(workers):
        executor.submit(preload, folder, token, workers, policy)
    parallel._backend.terminate()  # this call's temporary files; the workers stay
    _started = executor
    return True


def preload(folder: str, token: str, workers: int, policy: str) -> dict[str, Any]:
    """In a worker: what a job does before it loads torch (its OpenMP wait policy, its GPU), then
    the imports; held until every worker has taken one, so that each worker preloads."""
    from ablate.training.resources import assign_gpu, set_wait_policy

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    mine = path / f"{token}-{os.getpid()}.json"
    record: dict[str, Any] = {"pid": os.getpid(), "started": time.time()}
    mine.write_text(json.dumps(record))
    record["wait_policy"] = set_wait_policy(
        OmegaConf.create({"trainer": {"omp_wait_policy": policy}})
    )
    record["gpu"] = assign_gpu(workers=workers)
    t0 = time.perf_counter()
    for name in PRELOAD:
        importlib.import_module(name)
    for name in LATER:
        with contextlib.suppress(ImportError):  # a job that needs it says so itself
            importlib.import_module(name)
    record.update(modules=list(PRELOAD), seconds=round(time.perf_counter() - t0, 3))
    held = time.monotonic() + HOLD_S
    while len(list(path.glob(f"{token}-*.json"))) < workers and time.monotonic() < held:
        time.sleep(0.05)
    record["jobs"] = []
    _write(mine, record)
    global _record
    _record = mine
    return record


def note_job(num: int) -> None:
    """In a preloaded worker: add job ``num`` of the sweep to the worker's record."""
    if _record is not None:
        record = json.loads(_record.read_text())
        record["jobs"].append(num)
        _write(_record, record)


def _write(path: Path, record: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(record))  # whole: a reader never sees half a record


def preloaded(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a sweep's preloaded workers (``<sweep dir>/.workers``)."""
    path = Path(sweep_dir) / FOLDER
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))] if path.is_dir() else []
