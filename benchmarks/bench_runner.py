"""The bench's jobs (``bench.py``): each measured run in a fresh process, in alternating order.

Every job is a fresh process (so peak RSS is per job) and the recipes alternate (plain, ablate,
bf16, then bf16, ablate, plain, ...) so that drift in the machine's load hits all of them. Every
recipe logs to MLflow through the same callbacks; a job reads its numbers back from its run.

    python benchmarks/bench_runner.py '<job spec as JSON>'   # one job, as run_job starts it
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shared import compose, plain_fit

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
    # six blocks; caching needs them frozen. Another model trains (opt-in).
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


def job(spec: dict) -> None:
    """One measured run in this (fresh) process; writes its numbers to ``spec['result']``."""
    from mlflow.tracking import MlflowClient

    from ablate.training.resources import set_wait_policy

    cfg = compose(spec["overrides"])
    if spec["recipe"] != "plain":
        set_wait_policy(cfg.trainer)  # as ablate.train does, before torch loads OpenMP
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
            [sys.executable, __file__, json.dumps(spec)],
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


def run_jobs(
    configs: list[str],
    recipes: list[str],
    *,
    repeats: int,
    seed: int,
    model: str,
    common: list[str],
    bench_id: str,
    work: Path,
) -> list[dict]:
    """Every job: per config, ``repeats`` rounds of plain and ``recipes`` (round ``r`` with seed
    ``seed + r``, every other round in reverse order), each with the ``common`` overrides; their
    specs, logs and results in ``work``."""
    jobs: list[dict] = []
    for config_name in configs:
        _, both, ablate_only = CONFIGS[config_name]
        if config_name == "nodrop":
            both = both + dropout_off(model)
        for r in range(repeats):
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
                    + [f"seed={seed + r}"]
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
    return jobs


if __name__ == "__main__":
    job(json.loads(sys.argv[1]))
