"""The compute a run takes: the CPUs it may use, its torch threads, its GPU among a parallel
launcher's workers, and its peak memory."""

from __future__ import annotations

import logging
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

if TYPE_CHECKING:
    from ablate.config import TrainerCore


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (taskset, a SLURM or container
    cpuset), capped by ``SLURM_CPUS_PER_TASK`` where SLURM sets it; ``os.cpu_count()`` counts the
    whole machine."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cpus = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        cpus = min(cpus, int(slurm))
    return max(1, cpus)


def launcher_workers() -> int:
    """How many jobs a parallel launcher runs at once on this machine (1 outside one)."""
    if not HydraConfig.initialized():
        return 1
    workers = OmegaConf.select(HydraConfig.get(), "launcher.n_jobs", default=None) or 1
    return usable_cpus() if workers < 0 else workers  # joblib: -1 = one worker per CPU


def torch_threads(trainer: TrainerCore) -> int:
    """``trainer.threads``, else the usable CPUs divided among a parallel launcher's workers.

    joblib's workers start with OMP_NUM_THREADS=1, and each of N workers taking every CPU
    oversubscribes the machine; so each takes cpus // N.
    """
    if trainer.threads:
        return trainer.threads
    return max(1, usable_cpus() // launcher_workers())


log = logging.getLogger(__name__)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs):
    that variable where it is set, else every GPU the driver counts (NVML: CUDA is not started)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [name.strip() for name in listed.split(",") if name.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


_slots: dict[str, tuple[int, int, str]] = {}  # sweep key -> (slot, its lock's fd, the GPU taken)


def _claim_slot(workers: int, key: str) -> int | None:
    """The lowest of slots 0..workers-1 that no live process of sweep ``key`` holds, held by this
    process until it exits (an flock on a file per slot; the system drops it with the process)."""
    import fcntl

    folder = Path(tempfile.gettempdir()) / "ablate-gpu-slots" / key
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(workers):
        fd = os.open(folder / f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _slots[key] = (slot, fd, "")
        return slot
    return None


def assign_gpu(
    workers: int | None = None, gpus: list[str] | None = None, key: str | None = None
) -> str | None:
    """In a parallel launcher's worker on a machine with N > 1 GPUs, worker i takes GPU i mod N
    alone (``CUDA_VISIBLE_DEVICES``, set before CUDA starts): N workers run one job per GPU, k x N
    workers k jobs per GPU. Returns what it did, or None where there is nothing to do (no launcher
    workers, one GPU: the jobs share it; SLURM: each task gets its own GPUs).

    ``workers`` (the launcher's, ``launcher_workers``), ``gpus`` (``visible_gpus``) and ``key``
    (the sweep: the workers' parent process) default to this process's; a worker keeps its slot,
    and so its GPU, for every job it runs."""
    key = key or f"ppid{os.getppid()}"
    if key in _slots:
        slot, _, gpu = _slots[key]
        return f"worker {slot} of the sweep: GPU {gpu} (the worker's for all its jobs)"
    workers = launcher_workers() if workers is None else workers
    if workers <= 1:
        return None
    gpus = visible_gpus() if gpus is None else gpus
    if len(gpus) <= 1:
        return None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        log.warning(
            "%d GPUs, %d workers: CUDA started before a GPU was assigned; this job "
            "uses the first visible GPU",
            len(gpus),
            workers,
        )
        return None
    slot = _claim_slot(workers, key)
    if slot is None:
        return None
    gpu = gpus[slot % len(gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    _slots[key] = (slot, _slots[key][1], gpu)
    per_gpu = -(-workers // len(gpus))
    done = f"worker {slot} of {workers}: GPU {gpu} of {len(gpus)} (up to {per_gpu} jobs per GPU)"
    log.info("%s", done)
    return done


WAIT_POLICIES = ("auto", "passive", "inherit")


def busy_cpus(seconds: float = 0.5) -> float:
    """How many of this process's usable CPUs other processes keep busy now (a short sample)."""
    import psutil

    try:
        mine = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        mine = None
    per_cpu = psutil.cpu_percent(interval=seconds, percpu=True)
    used = [per_cpu[i] for i in mine if i < len(per_cpu)] if mine else per_cpu
    return sum(used) / 100.0


def set_wait_policy(trainer: TrainerCore) -> str:
    """Apply ``trainer.omp_wait_policy`` before torch loads OpenMP (which reads it then, once);
    returns what this process's OpenMP runs with, and why, for the run's record.

    ``auto``: PASSIVE when other processes keep at least half a CPU of ours busy at the start,
    else OpenMP's default. Measured (docs/operations.md): beside a busy job OpenMP's spinning
    made ablate's epochs 4-6x slower, PASSIVE 1.7x (its share of the cores: 2x); on an idle
    machine PASSIVE cost 5 % here and 39 % of a step on an AMX CPU, so it is not always on.
    """
    import sys

    from ablate.errors import AblateError

    global _loaded_with
    policy = trainer.omp_wait_policy
    if policy not in WAIT_POLICIES:
        raise AblateError(
            f"trainer.omp_wait_policy={policy!r} is not one of {', '.join(WAIT_POLICIES)}"
        )
    if "torch" not in sys.modules:  # OpenMP loads with torch: this process's policy is set here
        why = policy
        if policy == "auto":
            busy = busy_cpus()
            shared = busy >= 0.5
            why = f"auto: {busy:.1f} of {usable_cpus()} CPUs busy with other work at the start"
            policy = "passive" if shared else "inherit"
        if policy == "passive":
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        value = os.environ.get("OMP_WAIT_POLICY", "unset: OpenMP's spin-then-sleep")
        _loaded_with = f"{value} ({why})"
    if _loaded_with is None:  # e.g. a notebook that imported torch first
        return f"{os.environ.get('OMP_WAIT_POLICY', 'unset')} (torch loaded before ablate)"
    return _loaded_with


_loaded_with: str | None = None  # OMP_WAIT_POLICY as this process's OpenMP read it, and why


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
