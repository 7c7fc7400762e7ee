"""ablate's launcher of local worker processes (``hydra/launcher=workers``), whose workers start
preloaded.

The sweep (``ablate.sweep``) calls ``start`` as its first step: its own process imports the training
stack (torch, transformers, MLflow, ablate's training modules) once, takes those objects out of the
garbage collector's scans, and forks its ``n_jobs`` workers from itself, before it opens its store
(a forked process must not share its parent's database connections); a new sqlite store is made
meanwhile by a process of its own (``new_store``). Every job then runs in one of those workers, each
of which runs many jobs and imports nothing the sweep had imported, with the config the sweeper
composed to check it (``Kept``). The workers are the sweep's own children: a stop signal the sweep
receives reaches them (``ablate.tracking.signals.pass_on``), and a worker that dies ends the sweep,
as joblib's did. Each worker leaves ``<sweep dir>/.workers/<token>-<pid>.json``: what it started
with and the sweep's jobs it ran. Where ``fork`` is not available the workers are spawned and import
per worker.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import copy
import gc
import importlib
import json
import logging
import multiprocessing
import os
import time
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ablate.fileio import write_atomic

FOLDER = ".workers"
LAUNCHER = "hydra_plugins.ablate_launcher.PreloadedLauncher"
# What a job imports first; a model's own modules load when the job builds it.
PRELOAD = (
    "torch",
    "mlflow",
    "transformers",
    "ablate.tracking.run",
    "ablate.strategies.peft_methods",
    "ablate.training.prepare",
    "ablate.training.fit",
)
# Loaded on a job's first use where installed: the sqlite store's migrations check (alembic),
# the task's per-label report (scikit-learn), the run's git tags.
LATER = ("mlflow.store.tracking.sqlalchemy_store", "sklearn.metrics", "git")

log = logging.getLogger(__name__)

# The sweep's workers, started by ``start``: a module global, as the launcher is built by Hydra
# after the sweep's callback has started them, and a pool cannot be pickled with the callback.
_pool: cf.ProcessPoolExecutor | None = None
_record: Path | None = None  # in a worker: its record, which lists the jobs it runs


def count(launcher: DictConfig) -> int | None:
    """How many workers ablate's launcher runs (``resources.plan_workers``: ``n_jobs``, or with
    ``auto`` several jobs per GPU, the GPUs' free memory read once per process); None for
    another launcher."""
    planned = plan(launcher)
    return None if planned is None else planned[0]


def plan(launcher: DictConfig) -> tuple[int, str] | None:
    """``count``'s workers and why (what the sweep's log says once, as it starts)."""
    if launcher.get("_target_") != LAUNCHER:
        return None
    from ablate.training.resources import plan_workers

    return plan_workers(launcher)


def start(config: DictConfig) -> bool:
    """Import the training stack here and fork the sweep's workers from this process; False
    where the launcher is not ablate's or runs one job at a time (the jobs then run here)."""
    global _pool, _record
    planned = plan(config.hydra.launcher)
    if planned is None:
        return False
    workers, why = planned
    log.info("workers: %s", why)
    if workers <= 1:
        return False
    from ablate.training.resources import set_wait_policy

    # before torch loads OpenMP, which the workers inherit, and before the store's process
    # starts: its sample of how busy the CPUs are must not count our own work
    policy = set_wait_policy(config.trainer)
    store = new_store(config.tracking)  # made meanwhile, in a process of its own
    forked = "fork" in multiprocessing.get_all_start_methods()
    t0 = time.perf_counter()
    if forked:
        for name in PRELOAD:
            importlib.import_module(name)
        for name in LATER:
            with contextlib.suppress(ImportError):  # a job that needs it says so itself
                importlib.import_module(name)
        # The imported modules' objects live as long as the process: a job's full collections
        # (the Trainer runs one per job) then scan only what the job made, not them again.
        gc.freeze()
    seconds = round(time.perf_counter() - t0, 3)
    folder = Path(config.hydra.sweep.dir).resolve() / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "token": uuid.uuid4().hex[:8],
        "sweep": os.getpid(),
        "workers": workers,
        "wait_policy": policy,
        "modules": list(PRELOAD) if forked else [],
        "seconds": seconds,
    }
    _pool = cf.ProcessPoolExecutor(
        workers,
        multiprocessing.get_context("fork" if forked else "spawn"),
        initializer=_begin,
        initargs=(str(folder), record),
    )
    _pool.submit(int).result()  # forks all the workers now, before this process opens a store
    if store is not None:
        store.join()  # the sweep's own preparation then finds it made (or says what failed)
    return True


def new_store(tracking: DictConfig) -> multiprocessing.Process | None:
    """A fresh sqlite store's schema and experiment, made by a forked process while this one
    imports: MLflow's migrations of a new file take seconds of their own (with a disk sync at
    the end, not after each). None for a store that is there already, or a server's."""
    uri = str(tracking.uri)
    path = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or path.exists() or not path.parent.is_dir():
        return None
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    process = multiprocessing.get_context("fork").Process(
        target=_make_store, args=(uri, str(tracking.experiment)), daemon=True
    )
    process.start()
    return process


def _make_store(uri: str, experiment: str) -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from ablate.tracking.store import prepare

    # This process only makes the new file: its migrations (about 50 transactions) skip SQLite's
    # disk sync after each one (5 s of waits here), which guards against the machine's crash, not
    # a process's; the finished file is synced once.
    event.listen(Engine, "connect", _no_sync)
    with contextlib.suppress(Exception):  # the sweep prepares it again, and says what fails
        prepare(uri, experiment)
        fd = os.open(uri.removeprefix("sqlite:///"), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _no_sync(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA synchronous = OFF")
    cursor.close()


def _begin(folder: str, record: dict[str, Any]) -> None:
    """In a worker as it starts: its GPU (before CUDA starts), then its record (with what it
    started with: its parent, the modules it has loaded already)."""
    import sys

    from ablate.training.resources import PLANNED, assign_gpu, share_gpus, visible_gpus

    global _record
    os.environ[PLANNED] = str(record["workers"])  # the sweep's plan, for its jobs' threads
    share_gpus(record["workers"], len(visible_gpus()))
    mine = Path(folder) / f"{record['token']}-{os.getpid()}.json"
    done = {"pid": os.getpid(), "parent": os.getppid(), "started": time.time(), **record}
    loaded = [name for name in PRELOAD if name in sys.modules]
    done.update(loaded=loaded, gpu=assign_gpu(workers=record["workers"]), jobs=[])
    _write(mine, done)
    _record = mine


def launch(launcher, job_overrides, initial_job_idx: int) -> list:
    """Hydra's launch of a batch of jobs: each in one of the sweep's workers (started by
    ``start``; with one worker, one job after another in this process). At most one job per
    worker is handed out at a time, so that after a stop none waits in a queue to start."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, filter_overrides, setup_globals

    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info("Launching jobs, sweep output dir : %s", sweep_dir)
    for idx, overrides in enumerate(job_overrides):
        log.info("\t#%d : %s", initial_job_idx + idx, " ".join(filter_overrides(overrides)))
    loader = launcher.hydra_context.config_loader
    kept = loader.take(config) if isinstance(loader, Kept) else {}
    jobs = [
        (
            initial_job_idx + idx,
            list(overrides),
            launcher.hydra_context,
            config,
            launcher.task_function,
            Singleton.get_state(),
            kept.get(tuple(overrides)),
        )
        for idx, overrides in enumerate(job_overrides)
    ]
    if _pool is None:
        done = []
        for job in jobs:  # here, as Hydra's basic launcher: the sweep's logging back after each
            done.append(execute_job(*job))
            configure_log(config.hydra.hydra_logging, config.hydra.verbose)
        return done
    return _run(_pool, jobs, count(config.hydra.launcher) or 1)


def _run(pool: cf.ProcessPoolExecutor, jobs: list[tuple], workers: int) -> list:
    # cloudpickle both ways, as joblib's workers do: pickle cannot name the task function (which
    # hydra.main wraps) nor the config classes Hydra's plugins register in a job's result
    import pickle

    import cloudpickle

    results: dict[int, Any] = {}
    running: dict[cf.Future, int] = {}
    waiting = list(enumerate(jobs))
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                i, job = waiting.pop(0)
                running[pool.submit(_execute_pickled, cloudpickle.dumps(job))] = i
            done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for future in done:
                results[running.pop(future)] = pickle.loads(future.result())
    except BaseException as exc:
        # a dead worker: the pool has stopped the others (SIGTERM: their runs end KILLED); wait
        # for them to exit, so that the sweep's report sees their runs closed
        pool.shutdown(wait=isinstance(exc, cf.process.BrokenProcessPool), cancel_futures=True)
        raise
    return [results[i] for i in range(len(jobs))]


def _execute_pickled(job: bytes) -> bytes:
    import pickle

    import cloudpickle

    return cloudpickle.dumps(execute_job(*pickle.loads(job)))


def execute_job(
    idx: int, overrides, hydra_context, config, task_function, singleton_state, composed=None
):
    """One job, as Hydra's own launchers run it: its config composed with its overrides (or
    ``composed``, the sweep's composition of it), its number and id set, then ``run_job``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals
    from omegaconf import open_dict

    setup_globals()
    Singleton.set_state(singleton_state)
    # a copy: a job makes its config read-only, and jobs run here (or with equal overrides) would
    # otherwise share the one the sweeper kept
    sweep_config = copy.deepcopy(composed)
    if sweep_config is None:
        sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(
        hydra_context=hydra_context,
        config=sweep_config,
        task_function=task_function,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


class Kept:
    """A sweep's config loader that keeps the job configs it composes: Hydra's sweeper composes
    every job's config to check it before the launch, and the launch hands each job that
    config instead of composing it again in the worker (a third of a second of CPU a job)."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self._kept: dict[tuple[str, ...], tuple[DictConfig, DictConfig]] = {}

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]):
        composed = self.loader.load_sweep_config(master_config, sweep_overrides)
        self._kept[tuple(sweep_overrides)] = (master_config, composed)
        return composed

    def take(self, master_config: DictConfig) -> dict[tuple[str, ...], DictConfig]:
        """The configs composed so far from ``master_config``, by overrides; none kept after."""
        kept, self._kept = self._kept, {}
        return {k: cfg for k, (master, cfg) in kept.items() if master is master_config}

    def __getattr__(self, name: str):  # the rest of the loader's interface, as it is
        if name.startswith("__") or name == "loader":  # unpickling asks before it is set
            raise AttributeError(name)
        return getattr(self.loader, name)


def release() -> None:
    """Let the workers exit now (the jobs are done, or none will run), without waiting."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


def note_job(num: int) -> None:
    """In a worker: add job ``num`` of the sweep to the worker's record."""
    if _record is not None:
        record = json.loads(_record.read_text())
        record["jobs"].append(num)
        _write(_record, record)


def _write(path: Path, record: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(record))  # whole: a reader never sees half a record


def preloaded(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a sweep's workers (``<sweep dir>/.workers``)."""
    path = Path(sweep_dir) / FOLDER
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))] if path.is_dir() else []
