"""The compute a run takes: the CPUs it may use, its torch threads, its GPU among a parallel
launcher's workers, and its peak memory."""

from __future__ import annotations

import functools
import gc
import logging
import os
import resource
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
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


# The number of workers a sweep planned, passed to its workers' jobs: what they see of the GPUs'
# free memory once their neighbours have started is not what the sweep saw.
PLANNED = "ABLATE_LAUNCHER_WORKERS"
SHARING = "ABLATE_JOBS_ON_GPU"  # in a sweep's worker: how many of its jobs share one GPU


def launcher_workers() -> int:
    """How many jobs a parallel launcher runs at once on this machine (1 outside one): the
    sweep's plan where it made one (``plan_workers``), else the launcher's ``n_jobs``."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return 1
    if os.environ.get(PLANNED, "").isdigit():
        return int(os.environ[PLANNED])
    return plan_workers(OmegaConf.select(HydraConfig.get(), "launcher", default={}) or {})[0]


def jobs_on_gpu(device: str) -> int:
    """How many of the sweep's jobs run at once on this job's GPU (1 on a CPU, or alone): its
    workers over the GPUs they were spread on, as the worker set it (``share_gpus``)."""
    if not str(device).startswith("cuda"):
        return 1
    if os.environ.get(SHARING, "").isdigit():
        return int(os.environ[SHARING])
    return launcher_workers()


def share_gpus(workers: int, gpus: int) -> None:
    """In a sweep's worker as it starts, before its GPU is assigned: how many of the ``workers``
    share each of the ``gpus`` visible to the sweep, for its runs' ``jobs_on_gpu``."""
    os.environ[SHARING] = str(-(-workers // max(1, gpus)))


def plan_workers(launcher, cpus: int | None = None, free_mib: list[int] | None = None):
    """How many jobs ``launcher`` runs at once here, and why (for the sweep's log).

    ``n_jobs`` > 0: that many; < 0: joblib's count (-1 one per CPU, -2 all but one); ``auto``
    (ablate's launcher's default): with GPUs, several jobs on each (``jobs_per_gpu``, at most as
    many as its free memory holds at ``gpu_memory_per_job_gib`` each), at most one per CPU; without,
    one job at a time with every CPU, so that its times are its own. ``cpus`` and ``free_mib``
    (each visible GPU's free memory) default to this machine's. Workers take the GPUs in turn, so
    each GPU runs as many as the GPU with the least free memory holds; with fewer CPUs than
    GPUs, one worker per GPU all the same."""
    from ablate.errors import AblateError

    cpus = usable_cpus() if cpus is None else cpus
    n = launcher.get("n_jobs", 1)
    n = 1 if n is None else n
    # only ablate's launcher has auto, and the two keys below (conf/hydra/launcher/workers.yaml)
    fixed, per_job = (
        launcher[k] if n == "auto" else 1 for k in ("jobs_per_gpu", "gpu_memory_per_job_gib")
    )
    wrong = {
        "n_jobs": n != "auto" and not (isinstance(n, int) and n != 0),
        "jobs_per_gpu": fixed is not None and not (isinstance(fixed, int) and fixed > 0),
        "gpu_memory_per_job_gib": not (isinstance(per_job, int | float) and per_job > 0),
    }
    if bad := [key for key, is_wrong in wrong.items() if is_wrong]:
        raise AblateError(
            f"hydra.launcher.{bad[0]}={launcher.get(bad[0])!r}: n_jobs takes auto or a non-zero "
            "integer (-1 one job per CPU, -2 all but one), jobs_per_gpu a positive integer (or "
            "null: as many as the GPU's memory holds), gpu_memory_per_job_gib a positive number"
        )
    if n != "auto":
        return (n, f"n_jobs={n}") if n > 0 else (max(1, cpus + 1 + n), f"n_jobs={n}: {cpus} CPUs")
    free = gpu_free_mib() if free_mib is None else free_mib
    if not free:
        return 1, "n_jobs=auto: no GPU visible: one job at a time, with every CPU"
    # workers take GPUs in turn (assign_gpu), so each GPU gets as many as the smallest holds
    holds = min(max(1, int(mib / 1024 // per_job)) for mib in free)
    each = min(fixed, holds) if fixed else holds
    workers = len(free) * max(1, min(each, cpus // len(free)))
    how = f"jobs_per_gpu={fixed}, {per_job:g} GiB of free memory a job"
    why = (
        f"n_jobs=auto: {len(free)} GPU(s) with {', '.join(f'{m / 1024:.0f}' for m in free)} GiB "
        f"free, {how}, {cpus} CPUs: {workers} jobs at once"
    )
    if workers > len(free):  # the operator's choice, measured in benchmarks/JOURNAL.md
        why += " (several a GPU: NVIDIA's MPS daemon runs them side by side, docs/operations.md)"
    return workers, why


@functools.cache
def gpu_free_mib() -> list[int]:
    """Free memory (MiB) of each GPU this process may use (``CUDA_VISIBLE_DEVICES`` by index or
    UUID), as ``nvidia-smi`` reports it: the driver's tool, so that CUDA does not start in a sweep
    that forks its workers later; [] where there is no GPU or no driver."""
    import subprocess

    query = ["nvidia-smi", "--query-gpu=index,uuid,memory.free", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return free_of_visible(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def free_of_visible(nvidia_smi_csv: str, visible: str | None) -> list[int]:
    """The free MiB of the GPUs ``visible`` names (None: all), in its order, from nvidia-smi's
    ``index,uuid,memory.free`` rows."""
    rows: dict[str, int] = {}
    for line in nvidia_smi_csv.strip().splitlines():
        fields = [field.strip() for field in line.split(",")]
        try:  # a GPU whose memory it cannot read ([N/A], no permission) is left out
            index, uuid, free = fields
            rows[index] = rows[uuid] = int(float(free))
        except ValueError:
            continue
    if visible is None:
        return [rows[i] for i in rows if i.isdigit()]
    found = []
    for name in (n.strip() for n in visible.split(",") if n.strip()):
        # CUDA takes a UUID's unique prefix too (GPU-8932f9)
        match = [
            v
            for k, v in rows.items()
            if k == name or (name.startswith("GPU-") and k.startswith(name))
        ]
        if len(match) == 1:
            found += match
    return found


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

    global _loaded_with, _busy_at_start
    policy = trainer.omp_wait_policy
    if policy not in WAIT_POLICIES:
        raise AblateError(
            f"trainer.omp_wait_policy={policy!r} is not one of {', '.join(WAIT_POLICIES)}"
        )
    if "torch" not in sys.modules:  # OpenMP loads with torch: this process's policy is set here
        why = policy
        if policy == "auto":
            busy = _busy_at_start = busy_cpus()
            shared = busy >= PASSIVE_FROM
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
_busy_at_start: float | None = None  # what ``auto`` sampled then
# CPUs kept busy by other work at the start from which ``auto`` waits passively
PASSIVE_FROM = 0.5


def busy_at_start() -> float | None:
    """How many CPUs other work kept busy as this process's OpenMP loaded, where
    ``trainer.omp_wait_policy=auto`` sampled it (a sweep's workers inherit its sample)."""
    return _busy_at_start


# A run's tag: whose peak memory its peak_rss_mb is, ``job`` (its own, the high-water mark reset
# as it started) or ``process`` (its process's since it started: a sweep's earlier jobs included)
PEAK_RSS_TAG = "ablate.peak_rss"


def reset_peak_rss() -> str:
    """Reset this process's resident-memory high-water mark to what it holds now, so that
    ``peak_rss_mb`` measures the job that starts (a sweep runs several jobs in one process);
    ``job`` where it could, ``process`` where not (a kernel without ``/proc/self/clear_refs``)."""
    gc.collect()  # an earlier job's model and trainer, unreachable now, out of the baseline
    # psutil and resource read the mark but cannot reset it: Linux's clear_refs does (5: the peak)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return "process"
    return "job"


def peak_rss_mb() -> float:
    """Peak resident memory of this process since it started or since ``reset_peak_rss``, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# The CPU speed probe's work: PROBE_REPEATS products of PROBE_N-sided matrices (~50 ms on a core)
PROBE_N, PROBE_REPEATS = 512, 30


def cpu_gflops() -> float:
    """This process's CPU speed now: a fixed fp32 matrix product work with its torch threads,
    GFLOP/s. The CPU's name does not tell one host from another (a virtual machine's shared host
    runs the same CPU at different speeds), so runs record this and the report compares times
    only between runs of like speed. One timing of the whole work, not a median of short ones:
    a host that takes the CPU away for moments slows it as it slows training. Draws no random
    numbers."""
    import time

    import torch

    a = torch.full((PROBE_N, PROBE_N), 0.5)
    out = torch.empty_like(a)
    torch.mm(a, a, out=out)  # the first call allocates and warms the kernel up
    t0 = time.perf_counter()
    for _ in range(PROBE_REPEATS):
        torch.mm(a, a, out=out)
    return PROBE_REPEATS * 2 * PROBE_N**3 / (time.perf_counter() - t0) / 1e9
