"""``make setup``'s torch: pip's own index by default (here a local CPU wheel), CUDA's where
``nvidia-smi`` answers, any index a user names (read from the Makefile's own dry run)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers.data import ROOT

STAMP = ".venv/.setup-stamp"


def _torch_line(path: str, *given: str) -> str:
    """The pip command ``make setup`` would run for torch with ``PATH=path``."""
    env = {**os.environ, "PATH": path}
    out = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", STAMP, *given],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (line,) = [x for x in out.splitlines() if "pip install -q torch==" in x]
    return line


def test_setup_installs_the_cuda_build_where_nvidia_smi_answers(tmp_path):
    dirs = os.environ["PATH"].split(os.pathsep)  # this machine's own nvidia-smi aside
    plain = os.pathsep.join(d for d in dirs if not (Path(d) / "nvidia-smi").exists())
    assert _torch_line(plain).split()[-1] == "torch==2.13.0"  # no GPU here: pip's own index
    (bin_ := tmp_path / "bin").mkdir()
    smi = bin_ / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    with_gpu = f"{bin_}:{plain}"
    assert _torch_line(with_gpu).endswith("--index-url https://download.pytorch.org/whl/cu128")
    chosen = "TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu126"
    assert _torch_line(with_gpu, chosen).endswith(
        "--index-url https://download.pytorch.org/whl/cu126"
    )
    # a driver that does not answer: no GPU to install for
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert "--index-url" not in _torch_line(with_gpu)
    # any index a user names, GPU or not
    cpu = "TORCH_INDEX=https://download.pytorch.org/whl/cpu"
    assert _torch_line(plain, cpu).endswith("--index-url https://download.pytorch.org/whl/cpu")
