"""Two sweeps in one report (``--sweep A --sweep B``): each sweep's panels side by side, named by
its sweep, against its own baseline; one error for a sweep that has no runs. On a copy of the
real tiny grid and a second real sweep that reuses its ``none`` runs and trains ``first2``."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from helpers.grid import copy_grid, mean
from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs

from ablate import report
from ablate.report import charts, cli
from ablate.report.sweeps import labels


@pytest.fixture(scope="module")
def two(report_grid, slice_root, tmp_path_factory) -> SimpleNamespace:
    """The grid's copy with a second sweep (folder ``second``): none (reused) and first2, seeds
    1 and 2. ``by``: the second sweep's FINISHED runs by strategy and seed."""
    grid = copy_grid(report_grid, tmp_path_factory.mktemp("sweeps"))
    grid.second = grid.tmp / "second"
    overrides = [o for o in slice_overrides(slice_root, grid.store, grid.tmp)
                 if not o.startswith("hydra.sweep.dir")]  # fmt: skip
    proc = run_cli(
        "--multirun", "freeze=none,first2", "seed=1,2", *overrides,
        f"hydra.sweep.dir={grid.second}", "skip_finished=true", cwd=grid.tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    grid.by = {
        (r.data.params["freeze.name"], int(r.data.params["seed"])): r
        for r in logged_runs(grid.store)
        if r.info.status == "FINISHED"
    }
    return grid


def test_two_sweeps_side_by_side_each_against_its_own_baseline(two, tmp_path, capsys):
    out = tmp_path / "report"
    args = ["--uri", two.store, "--sweep", str(two.sweep), "--sweep", str(two.second)]
    assert cli.main([*args, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "6 runs used" in said  # none's two runs are both sweeps', counted once
    assert "left out: sweep: UD_Naija-Slice-first2-tiny-s1" in said  # the first's FAILED run

    summary = pd.read_csv(out / "summary.csv")
    assert list(zip(summary.sweep, summary.strategy, strict=True)) == [
        ("sweep", "none"), ("sweep", "all"), ("second", "none"), ("second", "first2"),
    ]  # fmt: skip
    assert list(summary.panel.unique()) == ["UD_Naija-Slice · sweep", "UD_Naija-Slice · second"]
    # the first sweep's rows are its own report's, number for number
    rep = report.build(report.load_sweeps("ablate", two.store, [str(two.sweep), str(two.second)]))
    alone = report.build(report.load_scope("ablate", two.store, str(two.sweep)))
    for got, want in ((rep.summary, alone.summary), (rep.per_tag.table, alone.per_tag.table)):
        first = got[got.sweep == "sweep"].drop(columns=["sweep", "panel"])
        pd.testing.assert_frame_equal(first.reset_index(drop=True), want.drop(columns="panel"))
    # the second's first2 against its own none, paired by seed, from MLflow's metrics
    row = summary[(summary.sweep == "second") & (summary.strategy == "first2")].iloc[0]
    dev = {s: two.by["first2", s].data.metrics["dev_accuracy"] for s in (1, 2)}
    base = {s: two.by["none", s].data.metrics["dev_accuracy"] for s in (1, 2)}
    assert row.dev_mean_pct == pytest.approx(100 * mean(list(dev.values())), rel=1e-12)
    assert row.delta_dev_pt == pytest.approx(mean([100 * (dev[s] - base[s]) for s in (1, 2)]))
    assert set(summary[summary.strategy == "none"].delta_method) == {"baseline"}

    runs = pd.read_csv(out / "runs.csv")
    none = {two.by["none", s].info.run_id for s in (1, 2)}
    for sweep in ("sweep", "second"):
        assert set(runs[(runs.sweep == sweep) & (runs.freeze == "none")].run_id) == none
    tags = pd.read_csv(out / "per_tag.csv")
    assert set(zip(tags.sweep, tags.strategy, strict=True)) == {
        ("sweep", "none"), ("sweep", "all"), ("second", "none"), ("second", "first2"),
    }  # fmt: skip
    md = (out / "summary.md").read_text()
    for label in ("sweep", "second"):
        assert f"## UD_Naija-Slice · {label} — model tiny, 2 epochs\n" in md
        assert f"### UD_Naija-Slice · {label} — model tiny, 2 epochs (test)\n" in md
    assert f"sweeps=sweep ({two.sweep}); second ({two.second})" in md

    # each chart: the two sweeps' panels next to each other, each titled by its sweep
    for name in report.CHARTS:
        fig = getattr(charts, name)(rep)
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles[:2] == list(summary.panel.unique()), name
        plt.close(fig)


def test_an_unknown_sweep_among_several_is_one_error_naming_it(two, capsys, tmp_path):
    out, nope = tmp_path / "report", tmp_path / "nope"
    args = ["--uri", two.store, "--sweep", str(two.sweep), "--sweep", str(nope), "--out", str(out)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --sweep {nope}: no sweep ran in {nope}")
    assert f"its latest sweeps with runs: {two.second} (4 runs, started " in err
    assert f"; {two.sweep} (5 runs, started " in err
    assert not out.exists()  # nothing read or written
    # the same sweep twice is that sweep's report, as --sweep once
    runs = report.load_sweeps("ablate", two.store, [str(two.second), str(two.second)])
    assert "sweep" not in runs.runs and runs.source["sweep"] == str(two.second)


def test_each_sweep_is_named_by_the_shortest_end_of_its_folder_that_tells_it_apart():
    assert labels(["/m/2026-01-01/12-00-00", "/m/2026-01-01/13-00-00"]) == ["12-00-00", "13-00-00"]
    assert labels(["/m/2026-01-01/12-00-00", "/m/2026-01-02/12-00-00"]) == [
        "2026-01-01/12-00-00", "2026-01-02/12-00-00",
    ]  # fmt: skip
