"""The compute a run takes: CPU threads, and its peak memory."""

from __future__ import annotations

import os
import resource

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


def torch_threads(cfg: DictConfig) -> int:
    """``trainer.threads``, else the cores divided among a parallel launcher's workers.

    joblib's workers start with OMP_NUM_THREADS=1, and each of N workers taking every core
    oversubscribes the machine; so each takes cores // N.
    """
    if cfg.trainer.threads:
        return cfg.trainer.threads
    cores = os.cpu_count() or 1
    workers = 1
    if HydraConfig.initialized():
        workers = OmegaConf.select(HydraConfig.get(), "launcher.n_jobs", default=None) or 1
        workers = cores if workers < 0 else workers  # joblib: -1 = one worker per core
    return max(1, cores // workers)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
