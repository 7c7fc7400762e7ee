"""A run alone and beside a busy process, for the plain recipe and ablate under each OpenMP wait
policy: how much a neighbour on the same cores slows a run, against its share of the cores. A
benchmark, not a test: it prints a markdown table with the machine's load (docs/operations.md
shows its tables), and with ``--out`` writes the times as JSON.

    make contention ARGS="--freeze features --train-sentences 3000"
    python benchmarks/contention.py --train-sentences 400 --epochs 1 --variants plain,auto

The neighbour is another training-like job: a torch process doing matrix products on every usable
CPU with OpenMP's default policy, as a colleague's run would. Sharing the cores with it, a run's
fair share is half of them: a 2x slowdown is proportional.
"""

from __future__ import annotations

import argparse
import json
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
# name -> (what the table calls it, the job's recipe, ablate's trainer.omp_wait_policy)
VARIANTS = {
    "plain": ("plain (OpenMP default)", "plain", None),
    "inherit": ("ablate, omp_wait_policy=inherit (OpenMP default)", "ablate", "inherit"),
    "passive": ("ablate, omp_wait_policy=passive", "ablate", "passive"),
    "auto": ("ablate, omp_wait_policy=auto (its default)", "ablate", "auto"),
}
SETTLE_S = 3  # the neighbour at full speed before a job starts beside it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="naija")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--freeze", default="none", help="the strategy every variant trains")
    parser.add_argument("--train-sentences", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    every = ", ".join(VARIANTS)
    parser.add_argument("--variants", help=f"of {every} (default: all; plain trains none only)")
    parser.add_argument("--uri", default=None, help="MLflow store (default: the project's)")
    parser.add_argument("--experiment", default="ablate-contention")
    parser.add_argument("--out", type=Path, default=None, help="also write the times as JSON")
    args = parser.parse_args(argv)
    names = chosen(parser, args)
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
            f"trainer.threads={threads}", f"tracking.uri={args.uri or default_tracking_uri()}",
            f"tracking.experiment={args.experiment}",
        ]  # fmt: skip
        compose(common)  # a bad option fails here, not in a child
        times: dict[str, dict[str, list[float]]] = {n: {"alone": [], "beside": []} for n in names}
        for r in range(args.repeats):
            for where in ("alone", "beside"):
                neighbour = None
                if where == "beside":
                    neighbour = subprocess.Popen(
                        [sys.executable, "-c", NEIGHBOUR.format(threads=threads)]
                    )
                    time.sleep(SETTLE_S)
                try:
                    for name in names:
                        _, recipe, policy = VARIANTS[name]
                        spec = {
                            "recipe": recipe, "config": "full", "bench_id": f"contention-{r}",
                            "result": str(work / "job.json"),
                            "overrides": [*common, f"seed={42 + r}"]
                            + ([f"trainer.omp_wait_policy={policy}"] if policy else []),
                        }  # fmt: skip
                        result = run_job(spec, work / "job.log")
                        seconds = statistics.mean(result["epoch_time_s"])
                        times[name][where].append(seconds)
                        print(f"{VARIANTS[name][0]}, {where}: {seconds:.2f} s/epoch", flush=True)
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = "python benchmarks/contention.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(table(times, threads, args, load_start, command.strip()))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        saved = {"command": command.strip(), "threads": threads, "load_start": load_start,
                 "times": times}  # fmt: skip
        args.out.write_text(json.dumps(saved, indent=1) + "\n")
    return 0


def chosen(parser: argparse.ArgumentParser, args) -> list[str]:
    """The variants to run, in ``VARIANTS``' order; plain trains ``none`` only (its recipe has no
    other strategy's head)."""
    if args.variants is None:
        return [n for n in VARIANTS if n != "plain" or args.freeze == "none"]
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        parser.error(f"--variants {args.variants}: each of {', '.join(VARIANTS)}")
    if "plain" in names and args.freeze != "none":
        parser.error(f"--variants plain: the plain recipe trains freeze=none, not {args.freeze}")
    return [n for n in VARIANTS if n in names]


def table(times: dict, threads: int, args, load_start: float, command: str) -> str:
    """Markdown: per variant, s/epoch alone and beside the neighbour, and their ratio."""
    first = next(iter(times))
    base_alone = statistics.mean(times[first]["alone"])
    caption = (
        f"{args.model}, freeze={args.freeze}, on {args.data} ({args.train_sentences} train "
        f"sentences), {args.epochs} "
        f"epoch(s), {threads} threads, mean of {args.repeats}; neighbour: a torch job on all "
        f"{threads} CPUs. Load average {load_start:.1f} at the start (the neighbour's own load "
        f"during its half). Command: `{command}`"
    )
    label = VARIANTS[first][0].split(" (")[0]
    columns = ["recipe", "alone, s/epoch", "beside a busy job, s/epoch"]
    columns += ["slowdown beside it (2x = its share)", f"alone vs {label} alone"]
    rows = []
    for name, measured in times.items():
        alone = statistics.mean(measured["alone"])
        beside = statistics.mean(measured["beside"])
        rows.append(
            [VARIANTS[name][0], f"{alone:.2f}", f"{beside:.2f}", f"{beside / alone:.2f}x"]
            + [f"{alone / base_alone:.2f}x"]
        )
    return f"{caption}\n\n{markdown_table(rows, columns, right=columns[1:])}"


if __name__ == "__main__":
    raise SystemExit(main())
