"""A parallel launcher's workers on a machine with several GPUs (``resources.assign_gpu``): real
joblib (loky) worker processes, with a faked device list in place of the driver's."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter

import pytest
from joblib import Parallel, delayed
from joblib.externals.loky import get_reusable_executor

from ablate.training.resources import assign_gpu, visible_gpus


def _job(workers: int, gpus: list[str], key: str) -> tuple[int, str | None, str | None]:
    did = assign_gpu(workers=workers, gpus=gpus, key=key)
    time.sleep(0.3)  # long enough that the launcher hands jobs to every worker
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES"), did


def _sweep(workers: int, gpus: list[str], jobs: int) -> list[tuple[int, str | None, str | None]]:
    key = f"test-{uuid.uuid4().hex}"  # one sweep: its own slots
    try:
        return Parallel(n_jobs=workers, backend="loky")(
            delayed(_job)(workers, gpus, key) for _ in range(jobs)
        )
    finally:  # the workers' CUDA_VISIBLE_DEVICES must not reach another test's jobs
        get_reusable_executor().shutdown(wait=True)


@pytest.mark.parametrize(("workers", "gpus"), [(2, ["0", "1"]), (4, ["0", "1"]), (3, ["GPU-a"])])
def test_each_worker_keeps_one_gpu_and_no_gpu_takes_more_than_its_share(workers, gpus):
    results = _sweep(workers, gpus, jobs=3 * workers)
    by_worker: dict[int, set] = {}
    for pid, device, _ in results:
        by_worker.setdefault(pid, set()).add(device)
    assert len(by_worker) <= workers
    assert all(len(devices) == 1 for devices in by_worker.values())  # kept for every job
    per_gpu = Counter(next(iter(devices)) for devices in by_worker.values())
    if len(gpus) == 1:  # one GPU: the workers share it, nothing is assigned
        assert all(did is None for *_, did in results)
        assert set(per_gpu) <= {os.environ.get("CUDA_VISIBLE_DEVICES")}
    else:
        assert set(per_gpu) <= set(gpus)
        assert max(per_gpu.values()) <= -(-workers // len(gpus))
        assert all(did and did.startswith("worker ") for *_, did in results)


def test_one_worker_or_one_gpu_assigns_nothing(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert assign_gpu(workers=1, gpus=["0", "1"], key=f"test-{uuid.uuid4().hex}") is None
    assert assign_gpu(workers=4, gpus=["0"], key=f"test-{uuid.uuid4().hex}") is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_visible_gpus_reads_cuda_visible_devices_without_starting_cuda(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, GPU-5f3a,7")
    assert visible_gpus() == ["2", "GPU-5f3a", "7"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    import torch

    assert len(visible_gpus()) == torch.cuda.device_count()
