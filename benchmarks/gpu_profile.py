"""Where a training step's time goes, for ``bench_gpu.py``'s profile phase: ``torch.profiler``
over a window of optimizer steps in the middle of an epoch, summed per step.

The window is counted in optimizer steps through torch's global optimizer hook, so the same code
profiles the plain recipe's Trainer and ablate's without a callback in either.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

# Ops that only change a tensor's metadata: dispatched, but no kernel runs for them.
VIEWS = frozenset(
    f"aten::{name}"
    for name in (
        "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand",
        "unsqueeze", "squeeze", "slice", "select", "alias", "detach", "lift_fresh", "unflatten",
        "flatten", "split", "split_with_sizes", "chunk", "narrow", "view_as", "empty", "empty_like",
        "empty_strided", "resolve_conj", "resolve_neg", "_reshape_alias", "contiguous",
    )
)  # fmt: skip


@contextmanager
def window(skip: int, active: int):
    """Profile optimizer steps ``skip + 1 .. skip + active`` (``skip`` >= 1) of what runs
    inside; yields a dict that holds, once the block ends, ``summarise``'s numbers (empty if too
    few steps ran)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    stamps: list[float] = []
    steps = schedule(wait=max(0, skip - 1), warmup=1, active=active, repeat=1)
    prof = profile(activities=activities, schedule=steps)

    def hook(*_):
        stamps.append(time.perf_counter())
        prof.step()

    result: dict = {}
    handle = register_optimizer_step_post_hook(hook)
    try:
        with prof:
            yield result
    finally:
        handle.remove()
    if skip >= 1 and len(stamps) >= skip + active:  # stamps[i]: the end of step i + 1
        wall = stamps[skip + active - 1] - stamps[skip - 1]
        result.update(summarise(prof.events(), active, wall, cuda))


def summarise(events, steps: int, wall_s: float, cuda: bool) -> dict:
    """Per step: wall time under the profiler, host ops that launch work, GPU kernels and their
    busy time, and the optimizer's share of the host time."""
    from torch.autograd import DeviceType

    host = [e for e in events if e.device_type == DeviceType.CPU]
    leaf_ops = [e for e in host if e.name.startswith("aten::") and not e.cpu_children
                and e.name not in VIEWS]  # fmt: skip
    optimizer = sum(e.cpu_time_total for e in host if e.name.startswith("Optimizer.step#"))
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    busy_us = sum(getattr(e, "device_time_total", 0) or 0 for e in kernels)
    per = 1.0 / steps
    return {
        "steps": steps,
        "step_ms": 1e3 * wall_s * per,
        "ops_per_step": len(leaf_ops) * per,
        "kernels_per_step": len(kernels) * per if cuda else None,
        "gpu_busy_ms": busy_us * 1e-3 * per if cuda else None,
        "optimizer_ms": optimizer * 1e-3 * per,
    }


def profiled(fn: Callable[[], None], skip: int, active: int) -> dict:
    """Run ``fn`` under ``window``; returns the per-step numbers."""
    with window(skip, active) as result:
        fn()
    return result
