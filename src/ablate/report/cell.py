"""One row of the summary: a strategy's runs in one panel, their means and intervals, and their
difference from the baseline's runs (``summary_row``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.report.stats import Predictions, bootstrap_interval, t_interval
from ablate.training.resources import PASSIVE_FROM

# summary.csv's lr_from where every run of a strategy trained at its own study's lr.
LR_FROM_STUDY = "its lr study"
# A run whose machine had more than this many runnable threads per usable CPU at the end of an
# epoch shared its cores: its times are not comparable with an idle machine's.
LOADED = 1.25
# A strategy whose slowest counted seed trained more than this many times as long as its fastest
# ran on a machine whose speed changed between its runs (a virtual machine's host, shared): its
# time, and any saving computed from it, is uncertain by about as much.
SPREAD = 1.25


def busy_cpus(df: pd.DataFrame) -> pd.Series:
    """Which runs (or summary rows) had more than ``LOADED`` runnable threads per CPU at an
    epoch's end. Not recorded counts as not busy."""
    return df.load_per_cpu > LOADED


def busy_at_start(df: pd.DataFrame) -> pd.Series:
    """Which runs started while other work kept CPUs busy: OpenMP then waits passively for the
    whole run (``trainer.omp_wait_policy=auto``), which slows it on the machine it has to itself
    afterwards (small kernels most: a BiLSTM head's epochs 3-4x)."""
    return df.busy_cpus_at_start >= PASSIVE_FROM


def shared_gpu(df: pd.DataFrame) -> pd.Series:
    """Which runs shared their GPU with other jobs of their sweep (``jobs_on_gpu``)."""
    return df.jobs_on_gpu > 1


def loaded(df: pd.DataFrame) -> pd.Series:
    """Which runs (or summary rows) were timed beside other work: ``busy_cpus``,
    ``busy_at_start`` or ``shared_gpu``."""
    return busy_cpus(df) | busy_at_start(df) | shared_gpu(df)


def machines(df: pd.DataFrame) -> pd.Series:
    """The CPU each run trained on (``not recorded`` for a run from before runs recorded it)."""
    return df.cpu.fillna("not recorded")


def peak_carried(df: pd.DataFrame) -> pd.Series:
    """Which runs' peak memory may hold earlier jobs' too: a sweep's later jobs (``job_num`` >
    0, in the process of earlier ones) whose job did not start from a reset high-water mark (the
    ``PEAK_RSS_TAG`` says ``job``; runs recorded before ablate reset it say nothing)."""
    later = pd.to_numeric(df.job_num, errors="coerce").fillna(0) > 0
    return later & (df.peak_rss_scope != "job")


def savings_loaded(summary: pd.DataFrame) -> pd.Series:
    """Which summary rows' time savings rest on a time measured beside other work: their own
    (``loaded``), or their panel's baseline's."""
    busy = loaded(summary)
    base = summary.delta_method == "baseline"
    base_busy = dict(zip(summary.panel[base], busy[base], strict=True))
    return busy | summary.panel.map(base_busy).fillna(False).astype(bool)


def savings_spread(summary: pd.DataFrame) -> pd.Series:
    """The largest ``train_time_spread`` (slowest / fastest seed) behind each summary row's time
    saving: its own, or its panel's baseline's; NaN where neither has two timed seeds."""
    spread = pd.to_numeric(summary.train_time_spread)
    base = summary.delta_method == "baseline"
    base_spread = summary.panel.map(dict(zip(summary.panel[base], spread[base], strict=True)))
    return pd.concat([spread, pd.to_numeric(base_spread)], axis=1).max(axis=1)


def spread_said(rows: list[dict]) -> str:
    """The strategies among summary ``rows`` whose seeds' train times spread beyond ``SPREAD``,
    each with its spread; empty where none does."""
    wide = [r for r in rows if r["train_time_spread"] > SPREAD]
    return ", ".join(f"{r['strategy']} {r['train_time_spread']:.2f}x" for r in wide)


def unloaded(cell: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``cell`` whose times count: those not timed beside other work (``loaded``),
    or all of them when every one was."""
    calm = cell[~loaded(cell)]
    return calm if len(calm) else cell


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
        "trainable_params_m": cell.trainable_params.mean() / 1e6,
        "total_params_m": cell.total_params.mean() / 1e6,
        "train_time_s": timed.train_time_s.mean(skipna=False),
        "train_time_s_std": timed.train_time_s.std(ddof=1) if len(timed) > 1 else math.nan,
        "train_time_spread": timed.train_time_s.max() / timed.train_time_s.min(),
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

    delta = {"delta_dev_pt": math.nan, "delta_ci_low_pt": math.nan, "delta_ci_high_pt": math.nan}
    delta["delta_method"] = "no baseline run"
    if base is not None and len(base):
        b = base.set_index("seed")
        delta["param_savings_pct"] = 100 * (
            1 - cell.trainable_params.mean() / b.trainable_params.mean()
        )
        # from the times the table shows: none where a timed run lacks its time
        delta["time_savings_pct"] = 100 * (
            1 - row["train_time_s"] / unloaded(base).train_time_s.mean(skipna=False)
        )
        paired = cell[cell.seed.isin(b.index)]
        diffs = (paired.dev.to_numpy() - b.loc[paired.seed, "dev"].to_numpy()) * 100
        if cell.run_id.isin(base.run_id).all():
            delta.update(delta_dev_pt=0.0, delta_method="baseline")
        elif len(paired) >= 3:
            mean, lo, hi = t_interval(diffs)
            method = f"paired t over {len(paired)} seeds"
            delta.update(delta_dev_pt=mean, delta_ci_low_pt=lo, delta_ci_high_pt=hi)
            delta["delta_method"] = method
        elif len(paired):
            delta["delta_dev_pt"] = float(diffs.mean())
            ids = [*paired.run_id, *b.loc[paired.seed, "run_id"]]
            correct = preds.correct(ids) if per_item else None
            if correct is not None:
                k = len(paired)
                per_item_diff = np.mean(correct[:k], axis=0) - np.mean(correct[k:], axis=0)
                lo, hi = bootstrap_interval(per_item_diff * 100, **boot)
                delta.update(delta_ci_low_pt=lo, delta_ci_high_pt=hi)
                s = "s" if k > 1 else ""
                delta["delta_method"] = f"paired bootstrap over {items} ({k} seed{s})"
            else:
                s = "s" if len(paired) > 1 else ""
                delta["delta_method"] = f"none ({len(paired)} paired seed{s}, {why})"
        else:
            delta["delta_dev_pt"] = dev.mean() - b.dev.mean() * 100
            delta["delta_method"] = "none (no seed in common with the baseline; unpaired means)"
    row.update(delta)
    return row
