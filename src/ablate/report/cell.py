"""One row of the summary: a strategy's runs in one panel, their means and intervals, and their
difference from the baseline's runs (``summary_row``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.report.delta import versus
from ablate.report.stats import Predictions, bootstrap_interval, t_interval
from ablate.report.timing import probe_spread, unloaded

# summary.csv's lr_from where every run of a strategy trained at its own study's lr.
LR_FROM_STUDY = "its lr study"


def peak_carried(df: pd.DataFrame) -> pd.Series:
    """Which runs' peak memory may hold earlier jobs' too: a sweep's later jobs (``job_num`` >
    0, in the process of earlier ones) whose job did not start from a reset high-water mark (the
    ``PEAK_RSS_TAG`` says ``job``; runs recorded before ablate reset it say nothing)."""
    later = pd.to_numeric(df.job_num, errors="coerce").fillna(0) > 0
    return later & (df.peak_rss_scope != "job")


def _spread(times: pd.Series) -> float:
    """Slowest / fastest of ``times``; NaN where the fastest rounds to 0 s (a tiny run) or none
    was recorded."""
    fastest = times.min()
    return times.max() / fastest if fastest > 0 else math.nan


def summary_row(
    cell: pd.DataFrame, base: pd.DataFrame | None, preds: Predictions, boot: dict
) -> dict:
    """The summary row of one strategy (``cell``: its runs, one per seed)."""
    dev, test = cell.dev * 100, cell.test * 100
    n = len(cell)
    timed = unloaded(cell)
    # A mean of per-item correctness is an accuracy: the bootstrap over dev items (words or
    # sentences) estimates only that, not an F1.
    per_item = cell.metric.iloc[0] == "accuracy"
    items = f"dev {cell['items'].iloc[0]}"
    why = (
        "no dev predictions logged"
        if per_item
        else f"no per-item bootstrap of {cell.metric.iloc[0]}"
    )
    row = {
        "n": n,
        "seeds": ",".join(str(s) for s in sorted(cell.seed)),
        "dev_mean_pct": dev.mean(),
        "dev_std_pct": dev.std(ddof=1) if n > 1 else math.nan,
        "dev_ci_low_pct": math.nan,
        "dev_ci_high_pct": math.nan,
        "dev_ci_method": "",
        "best_dev_mean_pct": (cell.best_dev * 100).mean(),
        "test_mean_pct": test.mean(),
        "test_std_pct": test.std(ddof=1) if n > 1 else math.nan,
        "lr": cell.lr.iloc[-1],
        "lr_from": LR_FROM_STUDY if cell.tuned.all() else "the recipe",
        # False where a run's study pick lay at its searched range's edge (not interior)
        "lr_interior": cell.lr_edge.isna().all() if cell.tuned.all() else math.nan,
        "trainable_params_m": cell.trainable_params.mean() / 1e6,
        "total_params_m": cell.total_params.mean() / 1e6,
        "train_time_s": timed.train_time_s.mean(skipna=False),
        "train_time_s_std": timed.train_time_s.std(ddof=1) if len(timed) > 1 else math.nan,
        "train_time_spread": _spread(timed.train_time_s),
        "cpu_gflops": timed.cpu_gflops.mean(),
        "timed_seeds": ",".join(str(s) for s in sorted(timed.seed)),
        "trainer_runtime_s": timed.trainer_runtime_s.mean(),
        # a resumed run's MLflow run spans the time it lay stopped too
        "wall_s": timed.wall_s[~timed.resumed.astype(bool)].mean(),
        "peak_rss_mb": cell.peak_rss_mb.mean(),
        "peak_rss_carried": bool(peak_carried(cell).any()),
        "train_flops": cell.train_flops.mean(),
        "load_per_cpu": timed.load_per_cpu.max(),
        "jobs_on_gpu": timed.jobs_on_gpu.max(),
        "busy_cpus_at_start": timed.busy_cpus_at_start.max(),
    }
    if n >= 3:
        _, lo, hi = t_interval(dev)
        row.update(dev_ci_low_pct=lo, dev_ci_high_pct=hi, dev_ci_method=f"t over {n} seeds")
    elif per_item and (correct := preds.correct(list(cell.run_id))) is not None:
        lo, hi = bootstrap_interval(np.mean(correct, axis=0) * 100, **boot)
        row.update(dev_ci_low_pct=lo, dev_ci_high_pct=hi, dev_ci_method=f"bootstrap over {items}")
    else:
        row["dev_ci_method"] = f"none ({n} seed{'s' if n > 1 else ''}, {why})"

    delta = {"delta_method": "no baseline run", "delta_test_method": "no baseline run"}
    if base is not None and len(base):
        b = base.set_index("seed")
        delta["param_savings_pct"] = 100 * (
            1 - cell.trainable_params.mean() / b.trainable_params.mean()
        )
        # from the times the table shows: none where a timed run lacks its time
        delta["time_savings_pct"] = 100 * (
            1 - row["train_time_s"] / unloaded(base).train_time_s.mean(skipna=False)
        )
        delta["speed_spread"] = probe_spread([timed.cpu_gflops, unloaded(base).cpu_gflops])
        delta.update(versus(cell, base, preds, boot))
    row.update(delta)
    return row
