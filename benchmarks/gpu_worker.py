"""``python benchmarks/gpu_worker.py SPEC.json``: jobs of ``bench_gpu.py``, one after another in
this process, each result written as soon as the job ends.

On a GPU the bench starts one worker per recipe: ablate's TF32 and attention-kernel settings are
process-wide, so the plain recipes never share a process with it. The first epoch of a process
also pays CUDA's start-up (context, cuBLAS handles, the allocator's first blocks); the table
reads the epochs after it.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shared import compose


class MemoryRecord:
    """A ``Recorder`` (ablate.tracking.recorder) that keeps a job's metrics in memory: the bench
    reads its numbers here, so its jobs need no tracking store."""

    resumed = None

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = defaultdict(list)

    def metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.history[key].append(float(value))

    def tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def text(self, text: str, path: str) -> None:
        pass

    def json(self, obj: Any, path: str) -> None:
        pass

    def artifacts(self, folder: str, path: str) -> None:
        pass

    def model(self, folder: str, name: str) -> None:
        pass

    def heartbeat(self) -> None:
        pass

    def info(self, section: str, values: Mapping[str, Any]) -> None:
        pass

    def dataset(self, name: str, source: str, sha256: str, context: str) -> None:
        pass


PLAIN = ("plain", "best_plain")  # gpu_plain.RECIPES' names start so (it imports torch)
KEPT = ("epoch_time_s", "dev_eval_time_s", "dev_accuracy", "train_tokens", "padding_pct")


def run_one(recipe: str, cfg, scratch: Path, profile: list[int] | None = None) -> dict:
    """One job of ``recipe`` (one of ``gpu_plain.RECIPES``, or ablate with overrides) on
    ``cfg``: its per-epoch numbers, per-step times (``gpu_plain.StepTimer``), peak GPU memory
    and wall time; with ``profile`` (skip, active), also the
    per-step profile of that window of optimizer steps (its times then pay the profiler's cost)."""
    import gpu_plain
    import torch
    from gpu_profile import profiled

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    record = MemoryRecord()
    t0 = time.perf_counter()

    steps: list = []
    settings: dict = {}

    def train() -> None:
        if recipe in gpu_plain.RECIPES:
            out = tempfile.mkdtemp(prefix="plain-", dir=scratch)
            settings.update(gpu_plain.fit(cfg, record, out, recipe, steps))
        else:
            from ablate import plugins
            from ablate.training.fit import fit
            from ablate.training.prepare import prepare

            plugins.register(gpu_plain.StepTimerPlugin)
            gpu_plain.StepTimerPlugin.steps = steps
            fit(cfg, prepare(cfg), record)

    profile_steps = profiled(train, *profile) if profile else train()
    if cuda:
        torch.cuda.synchronize()
    result = {key: record.history.get(key, []) for key in KEPT}
    result["wall_s"] = time.perf_counter() - t0
    result["profile"] = profile_steps
    result["steps"] = steps
    result["settings"] = settings
    result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    import transformers

    device = torch.cuda.get_device_name(0) if cuda else "CPU"
    result["device"] = (
        f"{device}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    gc.collect()  # the trainer and model of this job, before the next one measures its peak
    return result


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    results = Path(spec["results"])
    results.mkdir(parents=True, exist_ok=True)
    for job in spec["jobs"]:
        recipe = job["recipe"]
        cfg = compose(job["overrides"])
        if not recipe.startswith(PLAIN) and "torch" not in sys.modules:
            from ablate.training.resources import set_wait_policy

            set_wait_policy(cfg.trainer)  # as ablate.train does, before torch loads OpenMP
        result = run_one(recipe, cfg, results, job.get("profile"))
        result.update(job=job["id"], recipe=recipe, overrides=job["overrides"])
        (results / f"{recipe}--{job['id'].replace('/', '--')}.json").write_text(json.dumps(result))
        epochs = [round(x, 2) for x in result["epoch_time_s"]]
        print(f"{recipe} {job['id']}: {result['wall_s']:.1f} s, epochs {epochs} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
