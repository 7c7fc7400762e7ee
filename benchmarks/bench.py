"""``python benchmarks/bench.py`` (``make bench``): ablate's training against the plain recipe.

The plain recipe (``shared.py``) is the earlier study's: the stock HF Trainer, the tokenizer run
for every job, random batches padded per batch, the default AdamW and eval batches of 8 — with
the same model, data, lr, batch size, weight decay, epochs and frozen parameters as ablate.
``bench_runner.py`` runs the jobs, each in a fresh process, the recipes alternating;
``bench_table.py`` makes the summary, a markdown table of ablate / plain ratios, which this
prints, writes to ``--out`` and logs as a run of ``--experiment``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench_runner import CONFIGS, RECIPES, run_jobs
from bench_table import summarise, table
from shared import compose, write_slice

log = logging.getLogger("ablate.bench")


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 FLOP/s of an n x n matmul on this machine, with torch's current threads."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up: thread pool and kernel selection
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def _machine(peak: float, threads: int) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU {cpu}"
    return (
        f"{device}, {os.cpu_count()} cores, torch {torch.__version__} with {threads} threads; "
        f"measured fp32 matmul peak {peak / 1e9:.0f} GFLOP/s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description="ablate's training vs the plain HF Trainer recipe, same machine, alternating.",
    )
    parser.add_argument("--data", default="naija", help="dataset (conf/data)")
    parser.add_argument("--model", default="minilm", help="model (conf/model)")
    parser.add_argument("--train-sentences", type=int, default=400)
    parser.add_argument("--dev-sentences", type=int, default=200)
    parser.add_argument("--test-sentences", type=int, default=50)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="rounds per config, each with its own seed (SEED, SEED+1, ...) and alternating order",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--configs", default="full,first4", help=f"of {', '.join(CONFIGS)}")
    parser.add_argument(
        "--recipes",
        default="ablate,bf16",
        help="ablate recipes beside plain: ablate (its defaults), bucket (length_grouping=bucket), "
        "bf16 (trainer.bf16=true)",
    )
    parser.add_argument("--uri", default=None, help="MLflow store (default: the project's)")
    parser.add_argument("--experiment", default="ablate-bench")
    parser.add_argument("--out", default=None, help="folder for bench.md/json (reports/bench)")
    parser.add_argument(
        "--omp-wait-policy",
        default="inherit",
        help="OMP_WAIT_POLICY ('inherit', the default: each recipe as its users get it: plain "
        "with the environment's, ablate with trainer.omp_wait_policy=auto; PASSIVE or ACTIVE: "
        "that, for every job of both recipes)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.omp_wait_policy != "inherit":
        # OpenMP reads it when torch loads it: set before the import, and children inherit it.
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy

    from ablate import config

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; known: {', '.join(CONFIGS)}")
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if not recipes or [r for r in recipes if r not in RECIPES or r == "plain"]:
        parser.error(f"--recipes: ablate recipes out of {', '.join(RECIPES)} (plain always runs)")
    uri = args.uri or config.default_tracking_uri()
    out = Path(args.out or config.project_root() / "reports" / "bench").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-"))
    try:  # its data slice, caches and job logs (a failed job's error holds its log's tail)
        return _bench(args, argv, configs, recipes, uri, out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(args, argv, configs: list[str], recipes: list[str], uri: str, out: Path, work: Path):
    """Run the jobs in ``work``; write, log and print the table."""
    import torch

    from ablate.errors import AblateError
    from ablate.tracking.store import prepare

    sizes = {"train": args.train_sentences, "dev": args.dev_sentences, "test": args.test_sentences}
    task = compose([f"data={args.data}"]).data.task
    if task != "pos":  # the plain recipe and the slice are the POS study's
        raise AblateError(f"--data {args.data}: task {task!r}; the bench compares POS tagging only")
    treebank = write_slice(args.data, work / "data", sizes)
    threads = torch.get_num_threads()
    peak = matmul_peak()
    log.info("%s", _machine(peak, threads))
    bench_id = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    load_start = os.getloadavg()[0]
    common = [
        "data=ud",
        f"data.treebank={treebank}",
        f"data.root={work / 'data'}",
        f"data.tokenized_cache_dir={work / 'tokenized'}",  # cold for the first ablate job
        f"model={args.model}",
        f"trainer.epochs={args.epochs}",
        f"trainer.threads={threads}",
        *(["trainer.omp_wait_policy=inherit"] if args.omp_wait_policy != "inherit" else []),
        "trainer.measure_flops=true",
        f"tracking.uri={uri}",
        f"tracking.experiment={args.experiment}",
    ]
    jobs = run_jobs(
        configs, recipes, repeats=args.repeats, seed=args.seed, model=args.model, common=common,
        bench_id=bench_id, work=work,
    )  # fmt: skip
    summary = summarise(jobs, args.epochs, peak)
    body, ratios = table(summary, configs, args.epochs, recipes)
    command = "python benchmarks/bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (
        f"ablate vs the plain recipe: {args.model} on {args.data} ({args.train_sentences} train / "
        f"{args.dev_sentences} dev sentences), {args.epochs} epoch(s), "
        f"{args.repeats} round(s) of plain, {', '.join(recipes)} per config (seed {args.seed}+), "
        f"mean shown. "
        f"{_machine(peak, threads)}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; "
        f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.\n"
        f"Command: `{command.strip()}`\n\n"
    )
    report = header + body
    (out / "bench.md").write_text(report)
    (out / "bench.json").write_text(
        json.dumps({"peak_flops": peak, "ratios": ratios, "jobs": jobs}, indent=1)
    )
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    # a client, not mlflow's fluent API: its tracking URI would stay set for the whole process
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(prepare(uri, args.experiment), run_name=f"bench-{bench_id}")
    run_id = run_id.info.run_id
    params = {
        "data": args.data, "model": args.model, "train_sentences": args.train_sentences,
        "dev_sentences": args.dev_sentences, "epochs": args.epochs, "repeats": args.repeats,
        "configs": ",".join(configs), "threads": threads,
    }  # fmt: skip
    now = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, now, 0) for k, v in
                 {"matmul_peak_gflops": peak / 1e9, **ratios}.items()],
        params=[Param(k, str(v)) for k, v in params.items()],
        tags=[RunTag("bench.id", bench_id), RunTag("bench.role", "summary")],
    )  # fmt: skip
    client.log_text(run_id, report, "bench.md")
    client.log_dict(run_id, {"jobs": jobs}, "bench.json")
    client.set_terminated(run_id)
    print(report)
    log.info(
        "written %s; MLflow run bench-%s in %s (%s)",
        out / "bench.md",
        bench_id,
        uri,
        args.experiment,
    )
    return 0


def cli() -> int:
    """``main`` with ablate's errors as one line, as ``python -m ablate.train`` reports them."""
    from ablate.errors import AblateError

    try:
        return main()
    except AblateError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(cli())
