"""The bench's table (``bench.py``): per config and measure, plain's mean, then each ablate
recipe's and its ratio to plain (or, for dev accuracy, its difference in points)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench_runner import CONFIGS

from ablate.tables import markdown_table

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


def _compare(kind: str, plain: float, other: float) -> tuple[str, float | None]:
    if kind == "diff":
        return f"{other - plain:+.2f} pt", other - plain
    if kind == "ratio":
        ratio = other / plain if plain else float("nan")
        return f"{ratio:.2f}", ratio
    return "", None


def table(
    summary: dict, configs: list[str], epochs: int, recipes: Sequence[str] = ("ablate", "bf16")
) -> tuple[str, dict[str, float]]:
    """The markdown table (plain, then each ablate recipe and its ratio to plain; beside dev
    accuracy, plain's range over seeds, the noise a difference compares with) and the flat
    comparisons it shows (``<config>.<recipe>.<row>_ratio`` or ``_diff_pt``)."""
    recipes = [r for r in recipes if any((c, r) in summary for c in configs)]
    columns = ["config", "measure", "plain"]
    for r in recipes:
        name = "ablate" if r == "ablate" else f"ablate ({r})"
        columns += [name, f"{name} / plain"]
    rows = []
    comparisons: dict[str, float] = {}
    for config in configs:
        plain = summary[(config, "plain")]
        for i, (key, label, fmt, kind) in enumerate(ROWS):
            measure = label.replace("the last epoch", f"epoch {epochs}")
            low, high = plain["dev_acc_range"]
            if kind == "diff" and high > low:
                measure += f"; plain {low:.2f}-{high:.2f} over seeds"
            cells = [CONFIGS[config][0] if i == 0 else "", measure, fmt.format(plain[key])]
            for r in recipes:
                other = summary.get((config, r))
                if other is None:
                    cells += ["", ""]
                    continue
                compared, value = _compare(kind, plain[key], other[key])
                cells += [fmt.format(other[key]), compared]
                if value is not None:
                    suffix = "diff_pt" if kind == "diff" else "ratio"
                    comparisons[f"{config}.{r}.{key}_{suffix}"] = value
            rows.append(cells)
    return markdown_table(rows, columns, right=columns[2:]) + "\n", comparisons
