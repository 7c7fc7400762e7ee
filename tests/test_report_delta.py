"""The report against the baseline on test as on dev: Holm's adjustment and McNemar's exact test
against hand-computed values, both on the real tiny grid (its runs' logged test predictions; a
run whose test predictions are missing is counted out, not made up), and the finding that says
where dev and test disagree."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.grid import copy_grid, logged, mean
from mlflow.tracking import MlflowClient

from ablate import report
from ablate.docs import results
from ablate.report import stats
from ablate.report.delta import disagreement
from ablate.report.render import p_value


def test_holm_matches_hand_computed_adjustments():
    # sorted 0.005, 0.01, 0.03, 0.04: x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> never below an
    # earlier one's: 0.02, 0.03, 0.06, 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    got = stats.holm([math.nan, 0.02, 0.5])  # NaN is in no family: m = 2
    assert math.isnan(got[0]) and list(got[1:]) == pytest.approx([0.04, 0.5])
    assert list(stats.holm([0.6, 0.7])) == [1.0, 1.0]  # capped at 1
    assert list(stats.holm([0.2])) == [0.2]  # a family of one: unadjusted


def _mcnemar_by_hand(only_ours: int, only_theirs: int) -> float:
    """The exact two-sided McNemar p: twice the binomial(n, 1/2) tail of the smaller count."""
    n, low = only_ours + only_theirs, min(only_ours, only_theirs)
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(low + 1)) / 2**n)


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_items():
    ours = np.array([1] * 7 + [0] * 1 + [1] * 30 + [0] * 5)
    theirs = np.array([0] * 7 + [1] * 1 + [1] * 30 + [0] * 5)
    # 7 items only ours got right, 1 only theirs: (C(8,0)+C(8,1)) * 2 / 2^8 = 18/256
    assert stats.mcnemar_p(ours, theirs) == (7, 1, pytest.approx(18 / 256))
    assert stats.mcnemar_p(theirs, ours) == (1, 7, pytest.approx(18 / 256))
    assert stats.mcnemar_p(ours, ours) == (0, 0, 1.0)  # never disagree
    assert stats.mcnemar_p([1, 1, 0, 0], [0, 0, 1, 1])[2] == pytest.approx(1.0)


def test_the_paired_t_p_value_is_the_closed_form_for_three_seeds():
    # differences 1, 2, 3: t = 2 / (1 / sqrt 3); with 2 degrees of freedom p = 1 - t/sqrt(2+t^2)
    t = 2 * math.sqrt(3)
    assert stats.t_test_p([1.0, 2.0, 3.0]) == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert stats.t_test_p([-1.0, 1.0, 0.0]) == pytest.approx(1.0)
    assert math.isnan(stats.t_test_p([1.0]))
    _, lo, hi = stats.t_interval([0.1, 0.5, 0.2])
    assert (lo > 0) == (stats.t_test_p([0.1, 0.5, 0.2]) < 0.05)  # the interval's own test


def test_disagreement_says_how_dev_and_test_differ():
    inside, below, above = (-0.2, -0.45, 0.08), (-0.38, -0.49, -0.27), (0.3, 0.1, 0.5)
    assert disagreement(inside, below) == (
        "dev's interval (-0.45 to +0.08) includes zero, test's (-0.49 to -0.27) lies below it"
    )
    assert disagreement(below, inside, bounds=False) == "dev's interval lies below zero, test's "\
        "includes it"  # fmt: skip
    assert disagreement(below, above, bounds=False) == (
        "dev's interval lies below zero, test's above it"
    )
    assert disagreement(below, below) == "" and disagreement(inside, inside) == ""
    nan = math.nan
    assert disagreement((-0.1, nan, nan), (0.2, nan, nan)) == (
        "their signs differ (dev -0.10, test +0.20; without an interval on both)"
    )
    assert disagreement((-0.1, nan, nan), (-0.2, nan, nan)) == ""


def _test_predictions(store: str, run_id: str, tmp: Path) -> tuple[np.ndarray, np.ndarray]:
    import json

    path = MlflowClient(store).download_artifacts(run_id, "predictions/test.json", str(tmp))
    ids = json.loads(Path(path).read_text())
    return np.asarray(ids["gold"]), np.asarray(ids["pred"])


def test_test_difference_and_mcnemar_on_the_real_grid(report_grid, tmp_path):
    rep = report.make_report("ablate", report_grid.store)
    row = rep.summary.set_index("strategy").loc["all"]
    by = logged(report_grid)
    # Δ test: the mean of the per-seed test differences; two seeds: a bootstrap over test words
    diffs = [
        100 * (a.data.metrics["test_accuracy"] - b.data.metrics["test_accuracy"])
        for a, b in zip(by["all"], by["none"], strict=True)
    ]
    assert row.delta_test_pt == pytest.approx(mean(diffs), abs=1e-12)
    assert row.delta_test_method == "paired bootstrap over test words (2 seeds)"
    assert row.delta_test_ci_low_pt <= row.delta_test_pt <= row.delta_test_ci_high_pt
    assert math.isnan(row.delta_test_p) and math.isnan(row.delta_dev_p)  # a p needs a paired t

    # McNemar per seed from the logged test predictions, by hand
    counts, ps = [], []
    for n, (a, b) in enumerate(zip(by["all"], by["none"], strict=True)):
        gold, ours = _test_predictions(report_grid.store, a.info.run_id, tmp_path / f"a{n}")
        gold_b, theirs = _test_predictions(report_grid.store, b.info.run_id, tmp_path / f"b{n}")
        assert (gold == gold_b).all() and gold.size == a.data.metrics["test_words"]
        assert (gold == ours).mean() == pytest.approx(a.data.metrics["test_accuracy"])
        right, right_b = ours == gold, theirs == gold
        counts.append((int((right & ~right_b).sum()), int((~right & right_b).sum())))
        ps.append(_mcnemar_by_hand(*counts[-1]) if sum(counts[-1]) else 1.0)
    assert row.mcnemar_tested == "2 of 2 seeds" and row.mcnemar_seeds == "1,2"
    assert row.mcnemar_discordant == f"1: {counts[0][0]}/{counts[0][1]}; 2: {counts[1][0]}/"\
        f"{counts[1][1]}"  # fmt: skip
    assert row.mcnemar_p == pytest.approx(max(ps))
    assert row.mcnemar_p_holm == pytest.approx(max(ps))  # one comparison: nothing to adjust
    assert row.mcnemar_method == "exact, per seed on test words; the largest p"
    shown = report.table(rep).set_index("strategy").loc["all"]
    assert shown["McNemar on test, Holm p (seeds)"].endswith(" (2 of 2 seeds)")
    assert shown["Δ test vs none (pt) [95 % CI]"] == (
        f"{row.delta_test_pt:+.2f} [{row.delta_test_ci_low_pt:+.2f}, "
        f"{row.delta_test_ci_high_pt:+.2f}]"
    )
    assert rep.summary.set_index("strategy").loc["none", "delta_test_method"] == "baseline"


def test_seeds_without_test_predictions_are_counted_out(report_grid, tmp_path):
    """A run that logged no test predictions (as runs archived before archives kept them): its
    seed has no McNemar test, and the report says on how many seeds the test rests."""
    from mlflow.utils.file_utils import local_file_uri_to_path

    grid = copy_grid(report_grid, tmp_path)
    runs = sorted(logged(grid)["all"], key=lambda r: int(r.data.params["seed"]))

    def drop(run) -> None:
        folder = Path(local_file_uri_to_path(run.info.artifact_uri))
        (folder / "predictions" / "test.json").unlink()

    drop(runs[0])
    row = report.make_report("ablate", grid.store).summary.set_index("strategy").loc["all"]
    assert row.mcnemar_tested == "1 of 2 seeds" and row.mcnemar_seeds == "2"
    assert not math.isnan(row.mcnemar_p)
    # the bootstrap needs every paired seed's items: none here, and said so
    assert row.delta_test_method == "none (2 paired seeds, no test predictions logged)"
    assert math.isnan(row.delta_test_ci_low_pt) and not math.isnan(row.delta_test_pt)

    drop(runs[1])
    rep = report.make_report("ablate", grid.store)
    row = rep.summary.set_index("strategy").loc["all"]
    assert row.mcnemar_tested == "0 of 2 seeds" and math.isnan(row.mcnemar_p)
    assert row.mcnemar_method == "none (no seed's test predictions held for both runs)"
    assert report.table(rep).set_index("strategy").loc["all", "McNemar on test, Holm p (seeds)"] \
        == "– (0 of 2 seeds)"  # fmt: skip
    report.write(rep, tmp_path / "out")
    findings = results.results_findings(str(tmp_path / "out")).splitlines()
    assert (
        "- No McNemar test on test items: no seed has both its run's and full fine-tuning's "
        "test predictions held (0 of 2 seeds per strategy)." in findings
    )


def _three_seeds(report_grid, shifts: dict[str, tuple[list[float], list[float]]]):
    """The grid's runs with a third seed and a strategy ``first4`` (copies of real runs) whose
    dev and test scores are the baseline's plus ``shifts[strategy]`` (dev, test; one a seed)."""
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df, params = runs.runs, dict(runs.params)
    extra = df[df.seed == 1].copy()
    extra["seed"] = extra.seed + 2
    extra["run_id"] = extra.run_id + "-s3"
    extra["start_time"] = extra.start_time + pd.Timedelta(seconds=1)
    for r in extra.itertuples():
        params[r.run_id] = {**params[r.run_id.removesuffix("-s3")], "seed": "3"}
    df = pd.concat([df, extra], ignore_index=True)
    four = df[df.freeze == "all"].copy()
    four["freeze"], four["run_id"] = "first4", four.run_id + "-f4"
    for r in four.itertuples():
        params[r.run_id] = {**params[r.run_id.removesuffix("-f4")], "freeze.name": "first4"}
    df = pd.concat([df, four], ignore_index=True)
    base = df[df.freeze == "none"].sort_values("seed")
    for strategy, (dev, test) in shifts.items():
        mine = df.freeze == strategy
        order = df[mine].sort_values("seed").index
        df.loc[order, "dev"] = base.dev.to_numpy() + np.asarray(dev)
        df.loc[order, "test"] = base.test.to_numpy() + np.asarray(test)
    return report.Runs(df, runs.history, params, runs.source)


def test_holm_adjusts_a_panels_family_and_a_finding_says_where_dev_and_test_disagree(
    report_grid, tmp_path
):
    # `all`: within noise on dev, clearly behind on test; `first4`: behind on both
    shifts = {
        "all": ([0.001, -0.001, 0.0005], [-0.010, -0.011, -0.012]),
        "first4": ([-0.02, -0.025, -0.022], [-0.02, -0.024, -0.021]),
    }
    rep = report.build(_three_seeds(report_grid, shifts))
    s = rep.summary.set_index("strategy")
    for split, column in (("dev", "delta_dev_p"), ("test", "delta_test_p")):
        for strategy, (dev, test) in shifts.items():
            d = np.asarray(dev if split == "dev" else test) * 100
            t = abs(d.mean() / (d.std(ddof=1) / math.sqrt(3)))
            assert s.loc[strategy, column] == pytest.approx(1 - t / math.sqrt(2 + t * t))
        low, high = sorted(s.loc[["all", "first4"], column])
        adjusted = sorted(s.loc[["all", "first4"], f"{column}_holm"])
        assert adjusted == pytest.approx([2 * low, max(2 * low, high)])
    assert s.loc["all", "delta_test_method"] == "paired t over 3 seeds"
    # the copies' run ids hold no predictions: McNemar rests on the seeds whose runs logged them
    assert s.loc["all", "mcnemar_tested"] == "2 of 3 seeds"
    assert s.loc["first4", "mcnemar_tested"] == "0 of 3 seeds"

    row = s.loc["all"]
    said = (
        f"`all` against the baseline, dev and test disagree: dev's interval "
        f"({row.delta_ci_low_pt:+.2f} to {row.delta_ci_high_pt:+.2f}) includes zero, test's "
        f"({row.delta_test_ci_low_pt:+.2f} to {row.delta_test_ci_high_pt:+.2f}) lies below it."
    )
    assert any(n.endswith(said) for n in rep.notes)
    assert not any("`first4` against the baseline" in n for n in rep.notes)
    assert said in report.markdown(rep)

    out = tmp_path / "out"
    report.write(rep, out)
    findings = {
        line.split("`")[1]: line
        for line in results.results_findings(str(out)).splitlines()
        if line.startswith("- `")
    }
    assert findings["all"].endswith(
        f"and {row.delta_test_pt:+.2f} points of test accuracy (95 % CI "
        f"{row.delta_test_ci_low_pt:+.2f} to {row.delta_test_ci_high_pt:+.2f}, Holm-adjusted p "
        f"{p_value(row.delta_test_p_holm)}): dev and test disagree, dev's interval "
        "includes zero, test's lies below it. McNemar on test items: Holm-adjusted p "
        f"{p_value(row.mcnemar_p_holm)} (2 of 3 seeds)."
    )
    assert "disagree" not in findings["first4"]
    assert findings["first4"].endswith("No McNemar test on test items (0 of 3 seeds held).")
    table = results.results_deltas(str(out)).splitlines()
    (line,) = [t for t in table if t.startswith("| `all` |")]
    assert line.startswith(
        f"| `all` | {row.delta_dev_pt:+.2f} [{row.delta_ci_low_pt:+.2f}, "
        f"{row.delta_ci_high_pt:+.2f}] | {p_value(row.delta_dev_p_holm)} | "
        f"{row.delta_test_pt:+.2f} [{row.delta_test_ci_low_pt:+.2f}, "
        f"{row.delta_test_ci_high_pt:+.2f}] |"
    )
