"""``python benchmarks/bench.py`` (``make bench``): ablate's training against the plain recipe.

The plain recipe (``shared.py``) is the earlier study's: the stock HF Trainer, the tokenizer run
for every job, random batches padded per batch, the default AdamW and eval batches of 8 — with
the same model, data, lr, batch size, weight decay, epochs and frozen parameters as ablate.
Every job is a fresh process (so peak RSS is per job) and the recipes alternate (plain, ablate,
bf16, then bf16, ablate, plain, ...) so that drift in the machine's load hits all of them.
Every recipe logs to MLflow through the same callbacks; the summary (a markdown table of ablate /
plain ratios) is printed, written to ``--out`` and logged as a run of ``--experiment``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from shared import compose, plain_fit, write_slice

log = logging.getLogger("ablate.bench")

# name -> (what the table calls it, overrides for every recipe, overrides for ablate's only)
CONFIGS: dict[str, tuple[str, list[str], list[str]]] = {
    "full": ("full FT (freeze=none)", ["freeze=none"], []),
    # Dropout off in both recipes: without its random masks, which packing draws in other shapes,
    # ablate's training is plain's, so dev accuracy compares exactly (opt-in: --configs ...,nodrop)
    "nodrop": ("full FT without dropout", ["freeze=none"], []),  # + dropout_off(the model)
    "first4": (
        "freeze=first4 + embeddings (ablate: cache_frozen)",
        ["freeze=first4", "freeze.embeddings=true"],
        ["trainer.cache_frozen=true"],
    ),
    # The earlier study's first4 kept the embeddings training, so its backward ran through all
    # six blocks; caching needs them frozen. Another model trains: no accuracy tolerance (opt-in).
    "first4_study": (
        "freeze=first4 (plain: embeddings train, as the study ran it; ablate: frozen, cached)",
        ["freeze=first4"],
        ["freeze.embeddings=true", "trainer.cache_frozen=true"],
    ),
}
# The dropout probabilities of each architecture's config (``model_type``), for ``nodrop``.
DROPOUT_KEYS = {
    "bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"),
    "distilbert": ("dropout", "attention_dropout", "seq_classif_dropout"),
}
# recipe -> ablate overrides: its defaults, bucket batching (other batches), opt-in bf16 autocast
RECIPES: dict[str, list[str]] = {
    "plain": [],
    "ablate": [],
    "bucket": ["trainer.length_grouping=bucket"],
    "bf16": ["trainer.bf16=true"],  # opt-in: bf16 autocast (CPUs with AVX-512 BF16 / AMX)
}
# Ratio targets (ablate / plain at most this), per config and row: the goals docs/speed.md states.
TARGETS = {("full", "train"): 0.4, ("first4", "train"): 0.2, ("full", "eval"): 0.33}
ACC_TOLERANCE_PT = 0.2
ACC_CONFIGS = ("full", "nodrop")  # configs whose dev accuracy the tolerance applies to


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


def dropout_off(model: str) -> list[str]:
    """Overrides that set every dropout probability of ``model``'s architecture to 0."""
    from ablate.errors import AblateError
    from ablate.models.build import model_type

    kind = model_type(compose([f"model={model}"]).model)
    if kind not in DROPOUT_KEYS:
        raise AblateError(
            f"--configs nodrop: the dropout settings of model type {kind!r} are not known here "
            f"(known: {', '.join(DROPOUT_KEYS)})"
        )
    return [f"++model.config_overrides.{key}=0.0" for key in DROPOUT_KEYS[kind]]


HISTORIES = (
    "epoch_time_s", "dev_eval_time_s", "dev_accuracy", "train_loss", "train_tokens", "padding_pct"
)  # fmt: skip
SCALARS = (
    "tokenize_time_s",
    "cache_frozen_time_s",
    "train_flops_per_epoch",
    "peak_rss_mb",
    "test_accuracy",
)


def job(spec: dict) -> None:
    """One measured run in this (fresh) process; writes its numbers to ``spec['result']``."""
    from mlflow.tracking import MlflowClient

    from ablate.training.resources import set_wait_policy

    cfg = compose(spec["overrides"])
    if spec["recipe"] != "plain":
        set_wait_policy(cfg)  # as ablate.train does, before torch loads OpenMP
    from ablate.tracking.run import start_run
    from ablate.training.fit import fit
    from ablate.training.prepare import prepare

    prepared = prepare(cfg) if spec["recipe"] != "plain" else None
    with start_run(cfg) as run:
        run.tags({f"bench.{k}": spec[k] for k in ("recipe", "config", "bench_id")})
        if prepared is None:
            plain_fit(cfg, run, tempfile.mkdtemp(prefix="plain-", dir=Path(spec["result"]).parent))
        else:
            fit(cfg, prepared, run)
        run_id = run.id
    client = MlflowClient(cfg.tracking.uri)
    result: dict = {"run_id": run_id}
    for key in HISTORIES:
        points = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        result[key] = [m.value for m in points]
    metrics = client.get_run(run_id).data.metrics
    result.update({key: metrics.get(key) for key in SCALARS})
    Path(spec["result"]).write_text(json.dumps(result))


def run_job(spec: dict, log_path: Path) -> dict:
    """``job(spec)`` in a child process: its result plus wall time and peak RSS (ru_maxrss)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    t0 = time.perf_counter()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--job", json.dumps(spec)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not all children's
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"bench job {spec['recipe']}/{spec['config']} failed:\n{tail}")
    result = json.loads(Path(spec["result"]).read_text())
    result.update(wall_s=wall, rss_mb=usage.ru_maxrss / 1024.0)
    return result


def summarise(jobs: list[dict], epochs: int, peak: float) -> dict:
    """Per (config, recipe): the means over repeats of what the table shows."""

    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else float("nan")

    out: dict = {}
    for job_ in jobs:
        r = job_["result"]
        # The prefix cache is computed once before the first epoch: charged to the epochs.
        train = mean(r["epoch_time_s"]) + (r.get("cache_frozen_time_s") or 0.0) / epochs
        row = {
            "train_s": train,
            "eval_s": mean(r["dev_eval_time_s"]),
            "tokens": mean(r["train_tokens"]),
            "rss_mb": r["rss_mb"],
            "dev_acc": 100 * r["dev_accuracy"][-1],
            "flops": r["train_flops_per_epoch"] or 0.0,
            "epoch_s": mean(r["epoch_time_s"]),
            "padding_pct": mean(r["padding_pct"]),
            "tokenize_s": r["tokenize_time_s"] or 0.0,
            "wall_s": r["wall_s"],
        }
        out.setdefault((job_["config"], job_["recipe"]), []).append(row)
    summary = {k: {m: mean(row[m] for row in rows) for m in rows[0]} for k, rows in out.items()}
    for k, rows in out.items():
        s = summary[k]
        # rates from the means (a mean of per-job rates would let one fast job dominate), so
        # tokens/s agrees with the train time row
        s["tokens_per_s"] = s["tokens"] / s["train_s"]
        s["flops_pct"] = 100 * s["flops"] / s["epoch_s"] / peak
        s["dev_acc_range"] = (min(r["dev_acc"] for r in rows), max(r["dev_acc"] for r in rows))
    return summary


ROWS = (  # key, label, format, kind of comparison
    ("train_s", "train time per epoch (s)", "{:.1f}", "ratio"),
    ("eval_s", "dev evaluation time per epoch (s)", "{:.2f}", "ratio"),
    ("tokens_per_s", "training tokens/s (non-pad)", "{:.0f}", "ratio"),
    ("rss_mb", "peak RSS (MiB)", "{:.0f}", "ratio"),
    ("dev_acc", "dev accuracy after the last epoch (%)", "{:.2f}", "diff"),
    ("flops_pct", "achieved FLOP/s (% of matmul peak)", "{:.1f}", "ratio"),
    ("padding_pct", "padding in training batches (%)", "{:.1f}", "none"),
    ("tokenize_s", "tokenisation, all splits (s)", "{:.2f}", "ratio"),
    ("wall_s", "whole job, wall clock (s)", "{:.1f}", "ratio"),
)


def _compare(kind: str, plain: float, other: float) -> tuple[str, float | None]:
    if kind == "diff":
        return f"{other - plain:+.2f} pt", other - plain
    if kind == "ratio":
        ratio = other / plain if plain else float("nan")
        return f"{ratio:.2f}", ratio
    return "", None


def _verdict(config: str, key: str, kind: str, value: float | None) -> str:
    if value is None:
        return ""
    if kind == "diff":
        if config not in ACC_CONFIGS:
            return ""
        return "met" if abs(value) <= ACC_TOLERANCE_PT else "missed"
    goal = TARGETS.get((config, key.removesuffix("_s")))
    return "" if goal is None else "met" if value <= goal else "missed"


def table(
    summary: dict, configs: list[str], epochs: int, recipes: Sequence[str] = ("ablate", "bf16")
) -> tuple[str, dict[str, float]]:
    """The markdown table (plain, then each ablate recipe and its ratio to plain) and the flat
    comparisons it shows (``<config>.<recipe>.<row>_ratio`` or ``_diff_pt``)."""
    recipes = [r for r in recipes if any((c, r) in summary for c in configs)]
    head = ["config", "measure", "plain"]
    for r in recipes:
        name = "ablate" if r == "ablate" else f"ablate ({r})"
        head += [name, f"{name} / plain"]
    lines = ["| " + " | ".join([*head, "target"]) + " |", "|---|---|" + "--:|" * (len(head) - 2)]
    lines[-1] += "---|"
    comparisons: dict[str, float] = {}
    for config in configs:
        plain = summary[(config, "plain")]
        for i, (key, label, fmt, kind) in enumerate(ROWS):
            cells = [
                CONFIGS[config][0] if i == 0 else "",
                label.replace("the last epoch", f"epoch {epochs}"),
            ]
            cells.append(fmt.format(plain[key]))
            verdicts = []
            for r in recipes:
                other = summary.get((config, r))
                if other is None:
                    cells += ["", ""]
                    continue
                shown, value = _compare(kind, plain[key], other[key])
                cells += [fmt.format(other[key]), shown]
                if value is not None:
                    suffix = "diff_pt" if kind == "diff" else "ratio"
                    comparisons[f"{config}.{r}.{key}_{suffix}"] = value
                verdict = _verdict(config, key, kind, value)
                if verdict:
                    verdicts.append(f"{r}: {verdict}")
            goal = TARGETS.get((config, key.removesuffix("_s")))
            target = f"<= {goal}" if goal is not None else ""
            if kind == "diff" and config in ACC_CONFIGS:
                target = f"within {ACC_TOLERANCE_PT} pt"
            if kind == "diff":
                low, high = plain["dev_acc_range"]
                if high > low:
                    verdicts.append(f"plain over seeds {low:.2f}-{high:.2f}")
            if verdicts:
                target = f"{target}: {', '.join(verdicts)}" if target else ", ".join(verdicts)
            lines.append("| " + " | ".join([*cells, target]) + " |")
    return "\n".join(lines) + "\n", comparisons


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
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        job(json.loads(args.job))
        return 0
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
    jobs = []
    for config_name in configs:
        _, both, ablate_only = CONFIGS[config_name]
        if config_name == "nodrop":
            both = both + dropout_off(args.model)
        for r in range(args.repeats):
            order = ["plain", *recipes]
            for recipe in order if r % 2 == 0 else reversed(order):
                n = len(jobs)
                spec = {
                    "recipe": recipe,
                    "config": config_name,
                    "bench_id": bench_id,
                    "result": str(work / f"job{n}.json"),
                    # each pair gets its own seed: the spread across pairs is the seed noise
                    "overrides": common
                    + [f"seed={args.seed + r}"]
                    + both
                    + ([] if recipe == "plain" else ablate_only)
                    + RECIPES[recipe],
                }
                t0 = time.perf_counter()
                result = run_job(spec, work / f"job{n}.log")
                log.info(
                    "job %d %s/%s: %.0f s, train %s s/epoch, dev acc %s",
                    n, config_name, recipe, time.perf_counter() - t0,
                    [round(x, 1) for x in result["epoch_time_s"]],
                    [round(x, 4) for x in result["dev_accuracy"]],
                )  # fmt: skip
                jobs.append({"config": config_name, "recipe": recipe, "result": result})
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
