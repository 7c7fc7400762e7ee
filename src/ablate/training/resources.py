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


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
