"""The report's intervals on the real tiny grid: a paired bootstrap over dev words for 2 seeds,
none for 1 seed (and the report says so), a paired t interval from 3 seeds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ablate import report
from ablate.report import stats


@pytest.fixture(scope="module")
def rep(report_grid) -> report.Report:
    return report.make_report("ablate", report_grid.store)


def test_delta_interval_is_a_paired_bootstrap_over_dev_words(report_grid, rep):
    row = rep.summary.set_index("strategy").loc["all"]
    assert row.delta_method == "paired bootstrap over dev words (2 seeds)"
    assert row.delta_ci_low_pt <= row.delta_dev_pt <= row.delta_ci_high_pt
    assert row.dev_ci_method == "bootstrap over dev words"
    again = report.make_report("ablate", report_grid.store).summary.set_index("strategy").loc["all"]
    assert (again.delta_ci_low_pt, again.delta_ci_high_pt) == (
        row.delta_ci_low_pt, row.delta_ci_high_pt)  # fmt: skip
    # The logged predictions are the ones the dev accuracy was computed from.
    for r in report_grid.runs:
        if r.info.status == "FINISHED":
            gold, pred = report.load_predictions(report_grid.store, r.info.run_id)
            assert gold.size == r.data.metrics["dev_words"]
            assert (gold == pred).mean() == pytest.approx(r.data.metrics["dev_accuracy"])
    assert rep.summary.set_index("strategy").loc["none", "delta_method"] == "baseline"


def test_one_seed_has_no_interval_and_says_so(report_grid, monkeypatch, tmp_path):
    runs = report.load_runs("ablate", report_grid.store)
    one = runs.runs[runs.runs.seed == 1].reset_index(drop=True)
    runs = report.Runs(one, runs.history[runs.history.run_id.isin(one.run_id)], runs.params,
                       runs.source)  # fmt: skip
    with_preds = report.build(runs).summary.set_index("strategy")
    assert with_preds.loc["all", "delta_method"] == "paired bootstrap over dev words (1 seed)"

    monkeypatch.setattr(stats, "load_predictions", lambda *args: None)  # an older run
    rep = report.build(runs)
    s = rep.summary.set_index("strategy")
    assert (s.n == 1).all() and s.dev_std_pct.isna().all() and s.dev_ci_low_pct.isna().all()
    assert math.isnan(s.loc["all", "delta_ci_low_pt"])
    assert s.loc["all", "delta_method"] == "none (1 paired seed, no dev predictions logged)"
    assert any("one seed per strategy" in n for n in rep.notes)
    md = report.markdown(rep)
    assert "(1 seed)" in md and "one seed per strategy" in md
    assert "no dev predictions logged" in md
    paths = report.write(rep, tmp_path)
    assert all(paths[c].stat().st_size > 0 for c in report.CHARTS)


def test_three_seeds_use_a_paired_t_interval(report_grid):
    """Seeds 3..: copies of real runs with shifted scores (the report_grid itself has 2 seeds)."""
    from scipy import stats

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df, params = runs.runs, dict(runs.params)
    extra = df[df.seed == 1].copy()
    extra["seed"] = extra.seed + 2
    extra["dev"] = extra.dev + np.where(extra.freeze == "all", -0.01, 0.0)
    extra["run_id"] = extra.run_id + "-s3"
    extra["start_time"] = extra.start_time + pd.Timedelta(seconds=1)
    for r in extra.itertuples():
        params[r.run_id] = {**params[r.run_id.removesuffix("-s3")], "seed": "3"}
    df = pd.concat([df, extra], ignore_index=True)
    rep = report.build(report.Runs(df, runs.history, params, runs.source))
    row = rep.summary.set_index("strategy").loc["all"]
    base = df[df.freeze == "none"].set_index("seed").dev
    ours = df[df.freeze == "all"].set_index("seed").dev
    diffs = ((ours - base) * 100).to_numpy()
    half = stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / math.sqrt(3)
    assert row.delta_method == "paired t over 3 seeds"
    assert row.delta_dev_pt == pytest.approx(diffs.mean())
    assert (row.delta_ci_low_pt, row.delta_ci_high_pt) == pytest.approx(
        (diffs.mean() - half, diffs.mean() + half))  # fmt: skip
    assert row.dev_ci_method == "t over 3 seeds"


@pytest.mark.parametrize("seeds", [1, 3])
def test_bootstrap_by_counts_matches_scipys_resampling(seeds):
    """Correctness averaged over seeds has a few values: resampled by their counts, the interval
    is scipy's percentile bootstrap's within its own resampling noise, and repeatable."""
    from scipy import stats as sp

    rng = np.random.default_rng(7)
    values = np.mean([rng.random(20000) < 0.9 for _ in range(seeds)], axis=0) * 100
    lo, hi = stats.bootstrap_interval(values)
    ref = sp.bootstrap(
        (values,), np.mean, n_resamples=4000, method="percentile", random_state=rng, batch=500
    ).confidence_interval
    assert lo < values.mean() < hi
    assert abs(lo - ref.low) < 0.05 and abs(hi - ref.high) < 0.05  # half-width ~0.4 pt
    assert stats.bootstrap_interval(values) == (lo, hi)
    many = rng.normal(size=500)  # more values than counts pay for: scipy resamples them
    mlo, mhi = stats.bootstrap_interval(many)
    assert mlo < many.mean() < mhi
