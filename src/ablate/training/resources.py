"""The compute a run takes: the CPUs it may use, its torch threads, and its peak memory."""

from __future__ import annotations

import os
import resource

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


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


def torch_threads(cfg: DictConfig) -> int:
    """``trainer.threads``, else the usable CPUs divided among a parallel launcher's workers.

    joblib's workers start with OMP_NUM_THREADS=1, and each of N workers taking every CPU
    oversubscribes the machine; so each takes cpus // N.
    """
    if cfg.trainer.threads:
        return cfg.trainer.threads
    return max(1, usable_cpus() // launcher_workers())


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


def set_wait_policy(cfg: DictConfig) -> str:
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
    policy = cfg.trainer.omp_wait_policy
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
