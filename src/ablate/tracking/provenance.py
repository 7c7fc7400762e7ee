"""Where a run came from, as it records it: versions, device and host (``environment``), its
process (``process``, what ``stale`` checks), the code's commit (``git_tags``), its sweep job
(``sweep_tags``), and its name (``run_name``)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from ablate import config, overrides
from ablate.config import project_root
from ablate.tracking import procs
from ablate.tracking.parent import in_multirun


def environment() -> dict[str, str]:
    """Versions, device, CPU and host: what a reader needs to reproduce a number."""
    import importlib.metadata as md
    import platform

    import torch

    info = {"python": platform.python_version()}
    for package in ("torch", "transformers", "peft", "datasets", "mlflow", "hydra-core"):
        try:
            info[package] = md.version(package)
        except md.PackageNotFoundError:
            info[package] = "absent"
    info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    info["cpu"] = cpu_model()
    info["host"] = socket.gethostname()
    return info


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else what ``platform`` says): times compare
    only between runs on the same kind of machine."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def process() -> dict[str, Any]:
    """This process as ``mark_stale_runs`` checks it: host, pid and start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": procs.started(os.getpid())}


# Overrides already in a run's name, or that change where it goes rather than what it computes.
_NAMED = (
    "data",
    "data.name",
    "data.treebank",
    "freeze",
    "freeze.name",
    "model",
    "model.name",
    "seed",
)


def run_name(cfg: config.TrainCore) -> str:
    """``{data}-{freeze}-{model}-s{seed}``, then the job's other command-line overrides that
    change what it computes (``epochs=1``, ``smoke`` for ``experiment=smoke``), so runs of two
    different configurations are told apart."""
    name = f"{cfg.data.name}-{cfg.freeze.name}-{cfg.model.name}-s{cfg.seed}"
    if not HydraConfig.initialized():
        return name
    identity_flag = config.flags("identity")
    extra: dict[str, str] = {}  # by key: an override given twice counts once, the last
    for override in overrides.as_job_sees(HydraConfig.get().overrides.task):  # one naming
        key, _, value = override.lstrip("+~").partition("=")
        if (
            key in _NAMED
            or not identity_flag.get(key, True)
            or key.startswith(("hydra", "data.splits."))  # pins of the files, not what runs
        ):
            continue
        extra[key] = (
            value
            if "." not in key and key not in config.GROUPS
            else f"{key.rsplit('.', 1)[-1]}={value}"
        )
    return " ".join([name, *extra.values()])[:250]


def git_tags() -> dict[str, str]:
    """The commit the code ran from, and whether the checkout had uncommitted changes."""
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


def sweep_tags() -> dict[str, str]:
    """In a sweep: its folder and this job's number."""
    if not in_multirun():
        return {}
    hc = HydraConfig.get()
    job_num = OmegaConf.select(hc, "job.num", default=None)
    return {"hydra.sweep_dir": str(Path(hc.sweep.dir).resolve()), "hydra.job_num": str(job_num)}
