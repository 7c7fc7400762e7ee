"""A run alone and beside a busy process, for both recipes and both OpenMP wait policies: how
much a neighbour on the same cores slows a run, against its share of the cores. A benchmark, not
a test: it prints a markdown table with the machine's load (docs/operations.md shows one).

    python benchmarks/contention.py --train-sentences 400 --epochs 1

The neighbour is another training-like job: a torch process doing matrix products on every usable
CPU with OpenMP's default policy, as a colleague's run would. Sharing the cores with it, a run's
fair share is half of them: a 2x slowdown is proportional.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_runner import run_job
from shared import compose, write_slice

from ablate.tables import markdown_table

NEIGHBOUR = (
    "import torch\n"
    "torch.set_num_threads({threads})\n"
    "a = torch.randn(1024, 1024)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)
# (what the table calls it, the job's recipe, ablate's trainer.omp_wait_policy)
VARIANTS = (
    ("plain (OpenMP default)", "plain", None),
    ("ablate, omp_wait_policy=inherit (OpenMP default)", "ablate", "inherit"),
    ("ablate, omp_wait_policy=passive", "ablate", "passive"),
    ("ablate, omp_wait_policy=auto (its default)", "ablate", "auto"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="naija")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--freeze", default="none", help="the strategy every variant trains")
    parser.add_argument("--train-sentences", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from ablate.config import default_tracking_uri
    from ablate.training.resources import usable_cpus

    threads = usable_cpus()
    work = Path(tempfile.mkdtemp(prefix="ablate-contention-"))
    os.environ.pop("OMP_WAIT_POLICY", None)  # each variant says its own
    load_start = os.getloadavg()[0]
    try:
        sizes = {"train": args.train_sentences, "dev": 50, "test": 20}
        treebank = write_slice(args.data, work / "data", sizes)
        common = [
            "data=ud", f"data.treebank={treebank}", f"data.root={work / 'data'}",
            f"model={args.model}", f"freeze={args.freeze}", f"trainer.epochs={args.epochs}",
            f"trainer.threads={threads}",
            f"tracking.uri={default_tracking_uri()}", "tracking.experiment=ablate-contention",
        ]  # fmt: skip
        compose(common)  # a bad option fails here, not in a child
        times: dict[tuple[str, bool], list[float]] = {}
        for r in range(args.repeats):
            for beside in (False, True):
                neighbour = None
                if beside:
                    neighbour = subprocess.Popen(
                        [sys.executable, "-c", NEIGHBOUR.format(threads=threads)]
                    )
                    time.sleep(3)  # at full speed before the job starts
                try:
                    for name, recipe, policy in variants(args):
                        spec = {
                            "recipe": recipe, "config": "full", "bench_id": f"contention-{r}",
                            "result": str(work / "job.json"),
                            "overrides": [*common, f"seed={42 + r}"]
                            + ([f"trainer.omp_wait_policy={policy}"] if policy else []),
                        }  # fmt: skip
                        result = run_job(spec, work / "job.log")
                        seconds = statistics.mean(result["epoch_time_s"])
                        times.setdefault((name, beside), []).append(seconds)
                        where = "beside the neighbour" if beside else "alone"
                        print(f"{name}, {where}: {seconds:.1f} s/epoch", flush=True)
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(times, threads, args, load_start))
    return 0


def variants(args) -> tuple:
    """What runs: the plain recipe trains ``none`` only (no other strategy's head)."""
    return VARIANTS if args.freeze == "none" else VARIANTS[1:]


def table(times, threads: int, args, load_start: float) -> str:
    """Markdown: per variant, s/epoch alone and beside the neighbour, and their ratio."""
    first = variants(args)[0][0]
    base_alone = statistics.mean(times[(first, False)])
    caption = (
        f"{args.model}, freeze={args.freeze}, on {args.data} ({args.train_sentences} train "
        f"sentences), {args.epochs} "
        f"epoch(s), {threads} threads, mean of {args.repeats}; neighbour: a torch job on all "
        f"{threads} CPUs. Load average {load_start:.1f} at the start (the neighbour's own load "
        "during its half). Command: `python benchmarks/contention.py "
        + " ".join(sys.argv[1:])
        + "`"
    )
    columns = ["recipe", "alone, s/epoch", "beside a busy job, s/epoch"]
    columns += ["slowdown beside it (2x = its share)", f"alone vs {first.split(' (')[0]} alone"]
    rows = []
    for name, *_ in variants(args):
        alone = statistics.mean(times[(name, False)])
        beside = statistics.mean(times[(name, True)])
        rows.append(
            [name, f"{alone:.1f}", f"{beside:.1f}", f"{beside / alone:.2f}x"]
            + [f"{alone / base_alone:.2f}x"]
        )
    return f"{caption}\n\n{markdown_table(rows, columns, right=columns[1:])}"


if __name__ == "__main__":
    raise SystemExit(main())
