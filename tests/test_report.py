"""The comparison report from a real tiny multirun: numbers equal MLflow, charts, notebook."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pandas as pd
import pytest
from helpers.charts import overlaps
from helpers.data import ROOT
from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs
from mlflow.tracking import MlflowClient

from ablate import report
from ablate.errors import AblateError
from ablate.report import charts, layout, stats
from ablate.report.render import share
from ablate.tracking.params import primary_metric

CHART_FILES = [f"{name}.png" for name in report.CHARTS]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def grid(slice_root, tmp_path_factory) -> SimpleNamespace:
    """2 strategies x 2 seeds x 2 epochs (tiny model, Naija slice), plus one FAILED run."""
    tmp = tmp_path_factory.mktemp("report")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    overrides = slice_overrides(slice_root, store, tmp)
    # cwd=tmp: MLflow puts a sqlite store's artifacts under ./mlruns of the creating process.
    proc = run_cli("--multirun", "freeze=none,all", "seed=1,2", *overrides, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("ablate")
    # A run that failed in training (errors in the configuration or data leave no run at all):
    # recorded as ablate records one, with the params of the grid's runs.
    sibling = logged_runs(store)[0]
    params = dict(sibling.data.params)
    params.update({"freeze.name": "first2", "freeze.first": "2", "seed": "1"})
    failed = client.create_run(
        exp.experiment_id, run_name="UD_Naija-Slice-first2-tiny-s1",
        tags={"mlflow.parentRunId": sibling.data.tags["mlflow.parentRunId"]},  # one of the sweep's
    ).info  # fmt: skip
    for key, value in params.items():
        client.log_param(failed.run_id, key, value)
    client.set_tag(failed.run_id, "error", "RuntimeError: out of memory (injected)")
    client.set_terminated(failed.run_id, "FAILED")
    runs = logged_runs(store)
    assert sorted(r.info.status for r in runs) == ["FAILED"] + ["FINISHED"] * 4
    return SimpleNamespace(store=store, tmp=tmp, client=client, runs=runs)


@pytest.fixture(scope="module")
def cli(grid) -> SimpleNamespace:
    """``python -m ablate.report`` on the grid's store, in a real subprocess."""
    out = grid.tmp / "cli-report"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "ablate.report", "--uri", grid.store, "--out", str(out)],
        cwd=grid.tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return SimpleNamespace(out=out, stdout=proc.stdout)


@pytest.fixture(scope="module")
def rep(grid) -> report.Report:
    return report.make_report("ablate", grid.store)


def logged(grid) -> dict[str, list]:
    """FINISHED runs by strategy, read with MlflowClient, independently of ablate.report."""
    by = {}
    for r in grid.runs:
        if r.info.status == "FINISHED":
            by.setdefault(r.data.params["freeze.name"], []).append(r)
    return {k: sorted(v, key=lambda r: int(r.data.params["seed"])) for k, v in by.items()}


def epoch_seconds(grid, run) -> float:
    """Time spent in training epochs: the sum of the run's per-epoch ``epoch_time_s``."""
    return sum(m.value for m in grid.client.get_metric_history(run.info.run_id, "epoch_time_s"))


def mean(xs) -> float:
    return float(np.mean(xs))


def test_cli_writes_every_chart_and_both_tables(cli):
    for name in [*CHART_FILES, "summary.md", "summary.csv", "runs.csv"]:
        path = cli.out / name
        assert path.is_file() and path.stat().st_size > 0, name
    used = pd.read_csv(cli.out / "runs.csv")
    assert sorted(zip(used.freeze, used.seed, strict=True)) == [
        ("all", 1), ("all", 2), ("none", 1), ("none", 2),
    ]  # fmt: skip
    assert used.git_commit.notna().all() and (used.lr == 5e-5).all() and not used.tuned.any()
    for name in CHART_FILES:
        assert (cli.out / name).read_bytes()[:8] == PNG_MAGIC
    md = (cli.out / "summary.md").read_text()
    assert all(f"]({name})" in md for name in CHART_FILES)
    assert "4 runs used" in cli.stdout and "left out: UD_Naija-Slice-first2-tiny-s1" in cli.stdout


def test_summary_numbers_equal_logged_metrics(grid, cli):
    by = logged(grid)
    csv = pd.read_csv(cli.out / "summary.csv")
    assert list(csv.strategy) == ["none", "all"]  # the fixed order, baseline first
    base = by["none"]
    for strategy, runs in by.items():
        row = csv[csv.strategy == strategy].iloc[0]
        m = [r.data.metrics for r in runs]
        dev = [100 * x["dev_accuracy"] for x in m]
        test = [100 * x["test_accuracy"] for x in m]
        assert row.n == 2 and row.seeds == "1,2" and row.metric == "accuracy"
        assert row.dev_mean_pct == pytest.approx(mean(dev), rel=1e-12)
        assert row.dev_std_pct == pytest.approx(float(np.std(dev, ddof=1)), rel=1e-9)
        assert row.test_mean_pct == pytest.approx(mean(test), rel=1e-12)
        assert row.best_dev_mean_pct == pytest.approx(
            mean([100 * x["best_dev_accuracy"] for x in m]), rel=1e-12
        )
        params = mean([x["trainable_params"] for x in m])
        base_params = mean([r.data.metrics["trainable_params"] for r in base])
        assert row.trainable_params_m == pytest.approx(params / 1e6, rel=1e-12)
        assert row.param_savings_pct == pytest.approx(100 * (1 - params / base_params))
        time = mean([epoch_seconds(grid, r) for r in runs])
        base_time = mean([epoch_seconds(grid, r) for r in base])
        assert row.train_time_s == pytest.approx(time, rel=1e-12)
        runtime = mean([x["train_runtime_s"] for x in m])
        assert row.trainer_runtime_s == pytest.approx(runtime, rel=1e-12)
        assert row.time_savings_pct == pytest.approx(100 * (1 - time / base_time))
        base_dev = [b.data.metrics["dev_accuracy"] for b in base]
        diffs = [100 * (x["dev_accuracy"] - b) for x, b in zip(m, base_dev, strict=True)]
        assert row.delta_dev_pt == pytest.approx(mean(diffs), abs=1e-12)
        # The markdown shows the same numbers, rounded.
        md = (cli.out / "summary.md").read_text()
        assert f"| {strategy} | 5e-05 | {mean(dev):.2f} ± {np.std(dev, ddof=1):.2f} | 2 |" in md


def test_history_is_mlflow_metric_history(grid, rep):
    for runs in logged(grid).values():
        for r in runs:
            got = rep.history[(rep.history.run_id == r.info.run_id)]
            for key in ("dev_accuracy", "train_loss", "epoch_time_s"):
                want = sorted((m.step, m.value) for m in grid.client.get_metric_history(
                    r.info.run_id, key))  # fmt: skip
                rows = got[got.key == key].sort_values("epoch")
                assert list(zip(rows.epoch, rows.value, strict=True)) == want
                assert [s for s, _ in want] == [1, 2]  # step = epoch


def test_delta_interval_is_a_paired_bootstrap_over_dev_words(grid, rep):
    row = rep.summary.set_index("strategy").loc["all"]
    assert row.delta_method == "paired bootstrap over dev words (2 seeds)"
    assert row.delta_ci_low_pt <= row.delta_dev_pt <= row.delta_ci_high_pt
    assert row.dev_ci_method == "bootstrap over dev words"
    again = report.make_report("ablate", grid.store).summary.set_index("strategy").loc["all"]
    assert (again.delta_ci_low_pt, again.delta_ci_high_pt) == (
        row.delta_ci_low_pt, row.delta_ci_high_pt)  # fmt: skip
    # The logged predictions are the ones the dev accuracy was computed from.
    for r in grid.runs:
        if r.info.status == "FINISHED":
            gold, pred = report.load_predictions(grid.store, r.info.run_id)
            assert gold.size == r.data.metrics["dev_words"]
            assert (gold == pred).mean() == pytest.approx(r.data.metrics["dev_accuracy"])
    assert rep.summary.set_index("strategy").loc["none", "delta_method"] == "baseline"


def test_failed_and_missing_runs_are_left_out_and_listed(rep, cli):
    assert "first2" not in set(rep.summary.strategy)
    ex = rep.excluded.set_index(["freeze", "seed"])
    failed = ex.loc[("first2", 1)]
    assert failed.status == "FAILED" and "out of memory" in failed.reason
    assert ex.loc[("first2", 2)].status == "MISSING"  # the grid's seed 2 never ran
    assert len(rep.excluded) == 2
    md = (cli.out / "summary.md").read_text().split("## Runs left out")[1]
    assert "UD_Naija-Slice-first2-tiny-s1" in md and "FAILED" in md and "MISSING" in md


def test_one_seed_has_no_interval_and_says_so(grid, monkeypatch, tmp_path):
    runs = report.load_runs("ablate", grid.store)
    one = runs.runs[runs.runs.seed == 1].reset_index(drop=True)
    runs = report.Runs(one, runs.history[runs.history.run_id.isin(one.run_id)], runs.params,
                       runs.source)  # fmt: skip
    with_preds = report.build(runs).summary.set_index("strategy")
    assert with_preds.loc["all", "delta_method"] == "paired bootstrap over dev words (1 seed)"

    monkeypatch.setattr(stats, "load_predictions", lambda uri, run_id: None)  # an older run
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


def test_three_seeds_use_a_paired_t_interval(grid):
    """Seeds 3..: copies of real runs with shifted scores (the grid itself has 2 seeds)."""
    from scipy import stats

    runs = report.load_runs("ablate", grid.store, status="FINISHED")
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


def test_other_settings_make_their_own_table_and_reruns_are_left_out(grid):
    runs = report.load_runs("ablate", grid.store, status="FINISHED")
    df, params = runs.runs, dict(runs.params)
    old = df[(df.freeze == "none") & (df.seed == 1)].copy()
    old["run_id"], old["seed"] = "smoke", 42  # an earlier run with another recipe
    old["start_time"] = df.start_time.min() - pd.Timedelta(hours=1)
    params["smoke"] = {**params[df.run_id[old.index[0]]], "seed": "42", "trainer.epochs": "1"}
    rerun = df[(df.freeze == "all") & (df.seed == 2)].copy()
    rerun["run_id"] = "rerun"
    rerun["start_time"] = df.start_time.max() + pd.Timedelta(hours=1)
    params["rerun"] = params[df.run_id[rerun.index[0]]]
    variant = df[(df.freeze == "all") & (df.seed == 1)].copy()  # same strategy name, other option
    variant["run_id"], variant["seed"] = "variant", 7
    variant["start_time"] = df.start_time.min() - pd.Timedelta(minutes=1)
    params["variant"] = {
        **params[df.run_id[variant.index[0]]], "seed": "7", "freeze.embeddings": "True"
    }  # fmt: skip
    df = pd.concat([old, variant, df, rerun], ignore_index=True)
    rep = report.build(report.Runs(df, runs.history, params, runs.source))
    reasons = dict(zip(rep.excluded.seed, rep.excluded.reason, strict=True))
    assert "freeze.embeddings=True (latest: False)" in reasons[7]
    assert reasons[2] == "superseded by the later run rerun"
    # two groups of settings: two tables, and no mean across them
    panels = dict(rep.summary.groupby("panel").n.apply(list))
    assert panels == {"UD_Naija-Slice · epochs=2": [2, 2], "UD_Naija-Slice · epochs=1": [1]}
    assert "rerun" in set(rep.runs.run_id) and "smoke" in set(rep.runs.run_id)
    assert not any("different settings" in note for note in rep.notes)
    md = report.markdown(rep)
    # headed by their settings beyond the defaults, not by the key that tells them apart
    assert "## UD_Naija-Slice — model tiny, 1 epoch\n" in md
    assert "## UD_Naija-Slice — model tiny, 2 epochs\n" in md


def test_filters(grid):
    # the sweep: its parent's children (the four jobs and the one that failed in training)
    assert len(report.load_runs("ablate", grid.store, sweep="latest").runs) == 5
    assert len(report.load_runs("ablate", grid.store, sweep=str(grid.tmp / "sweep")).runs) == 5
    assert len(report.load_runs("ablate", grid.store, status="FAILED").runs) == 1
    assert len(report.load_runs("ablate", grid.store, model=["tiny"]).runs) == 5
    with pytest.raises(AblateError, match="no usable runs"):
        report.build(report.load_runs("ablate", grid.store, data="naija"))
    with pytest.raises(AblateError, match="no MLflow experiment"):
        report.load_runs("nope", grid.store)


def test_strategy_order():
    names = ["zeta", "gradual", "lora", "all", "alpha", "none", "first4", "bitfit", "embeddings"]
    assert report.strategy_order(names) == [
        "none", "embeddings", "first4", "all", "bitfit", "lora", "gradual", "alpha", "zeta",
    ]  # fmt: skip
    assert primary_metric({"best_dev_accuracy": 0.9, "dev_f1": 0.5}) == "accuracy"
    assert primary_metric({}) == "accuracy"  # a run that logged none (failed early)
    # every strategy ablate knows, and any other, gets a colour of its own; the baseline black
    colours = layout.palette([*report.STRATEGY_ORDER, "alpha", "zeta"])
    assert len(set(colours.values())) == len(colours) and colours["none"] == layout.BASELINE_COLOR


def test_notebook_runs_headless_on_the_same_module(grid, monkeypatch, tmp_path):
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / "compare.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit it cleared"
    assert not any(re.search(r"\d\.\d", c.source) for c in code)  # no number typed in
    out = tmp_path / "nb-report"
    monkeypatch.setenv("ABLATE_REPORT_URI", grid.store)
    monkeypatch.setenv("ABLATE_REPORT_EXPERIMENT", "ablate")
    monkeypatch.setenv("ABLATE_REPORT_OUT", str(out))
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(path.parent)}}
    ).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == len(report.CHARTS)
    assert all((out / name).stat().st_size > 0 for name in CHART_FILES)
    shown = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    for strategy, runs in logged(grid).items():
        dev = mean([100 * r.data.metrics["dev_accuracy"] for r in runs])
        assert f"| {strategy} | 5e-05 | {dev:.2f} ± " in shown
    assert "UD_Naija-Slice-first2-tiny-s1" in shown
    assert Path(outputs[-1].text.strip()) == Path(sys.executable)
    assert list(pd.read_csv(out / "summary.csv").strategy) == ["none", "all"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.csv", "summary.md", "runs.csv", *CHART_FILES]
    )

    # Unset, the folder is one of its own, never `make report`'s reports/, and its text says so
    monkeypatch.delenv("ABLATE_REPORT_OUT")
    setup: dict = {}
    exec(code[0].source, setup)
    assert Path(setup["OUT"]) == report.default_out_dir() / "notebook"
    # its runs by default are `make report`'s: the latest sweep; the first cell says so
    assert (
        setup["SWEEP"] == "latest" and "as `make report` reports by default" in nb.cells[0].source
    )
    assert "`ABLATE_REPORT_OUT` (default: `reports/notebook/`)" in nb.cells[0].source


def test_make_notebook_allows_root_only_for_root():
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "notebook"], capture_output=True, text=True, check=True
    )
    (lab,) = [line for line in dry.stdout.splitlines() if "jupyter lab" in line]
    assert lab.split()[1:3] == ["lab", "notebooks/compare.ipynb"]
    assert ("--allow-root" in lab.split()) == (os.geteuid() == 0)


def test_charts_of_a_one_epoch_one_seed_grid_of_every_strategy_are_readable(grid):
    import matplotlib.pyplot as plt

    runs = report.load_runs("ablate", grid.store, status="FINISHED")
    base = runs.runs[(runs.runs.seed == 1)].reset_index(drop=True)
    frames, params = [], dict(runs.params)
    for i, strategy in enumerate(report.STRATEGY_ORDER):  # every strategy ablate knows
        row = base.iloc[[i % len(base)]].copy()
        row["freeze"], row["run_id"] = strategy, f"{strategy}-1"
        row["train_time_s"] = row.train_time_s * (1 - i / 20)  # a saving to label on each bar
        params[f"{strategy}-1"] = params[base.run_id.iloc[i % len(base)]]
        frames.append(row)
    one = pd.concat(frames, ignore_index=True)
    history = runs.history[runs.history.epoch == 1].copy()  # a 1-epoch grid
    history = pd.concat(
        [
            history[history.run_id == base.run_id.iloc[i % len(base)]].assign(
                run_id=f"{strategy}-1", freeze=strategy
            )
            for i, strategy in enumerate(report.STRATEGY_ORDER)
        ],
        ignore_index=True,
    )
    rep = report.build(report.Runs(one, history, params, runs.source), predictions=False)
    assert len(rep.summary) == len(report.STRATEGY_ORDER) and (rep.summary.n == 1).all()
    for name in report.CHARTS:
        fig = getattr(charts, name)(rep)
        assert overlaps(fig) == [], name
        if name == "convergence":  # one epoch: the axis says so, with no fractional epochs
            ticks = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
            assert ticks == ["1"]
        plt.close(fig)


def test_the_results_pages_blocks_read_the_reports_files(cli):
    from ablate import docs

    summary = pd.read_csv(cli.out / "summary.csv").set_index("strategy")
    path = str(cli.out)
    table = docs.results.results_table(path, rerun=True).splitlines()
    (row,) = [line for line in table if line.startswith("| `all` |")]
    all_ = summary.loc["all"]
    assert f"| {all_.dev_mean_pct:.2f} ± {all_.dev_std_pct:.2f} |" in row
    assert row.endswith("| 2 | `python -m ablate.train --multirun experiment=paper "
                        "data=UD_Naija-Slice freeze=all` |")  # fmt: skip
    findings = docs.results.results_findings(path)
    assert f"{summary.loc['none'].dev_mean_pct:.2f} ± " in findings
    assert (
        f"- `all` trains {share(all_.param_savings_pct, 0)} % fewer parameters in "
        f"{share(all_.time_savings_pct, 0)} % less training time, and scores "
        f"{all_.delta_dev_pt:+.2f} points of dev accuracy" in findings
    )
    commit = pd.read_csv(cli.out / "runs.csv").git_commit.iloc[0][:7]
    assert docs.results.results_provenance(path).startswith(
        "4 runs (all, none; seeds 1, 2), started "
    )
    assert f"from commit {commit};" in docs.results.results_provenance(path)


def test_times_measured_on_a_loaded_machine_are_left_out_where_calm_ones_exist(grid):
    runs = report.load_runs("ablate", grid.store, status="FINISHED")
    df = runs.runs.copy()
    busy = (df.freeze == "none") & (df.seed == 1) | (df.freeze == "all")
    df.loc[busy, "load_per_cpu"] = 3.0
    df.loc[~busy, "load_per_cpu"] = 0.5
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    s = rep.summary.set_index("strategy")
    calm = df[(df.freeze == "none") & (df.seed == 2)].train_time_s.iloc[0]
    assert s.loc["none"].train_time_s == pytest.approx(calm) and s.loc["none"].timed_seeds == "2"
    assert s.loc["none"].n == 2  # its accuracy still counts both seeds
    all_time = df[df.freeze == "all"].train_time_s.mean()  # every seed loaded: all of them, marked
    assert s.loc["all"].train_time_s == pytest.approx(all_time)
    assert s.loc["all"].time_savings_pct == pytest.approx(100 * (1 - all_time / calm))
    (note,) = [n for n in rep.notes if "loaded machine" in n]
    assert "none seed 1" in note and "all seed 1" in note and "none seed 2" not in note
    times = report.table(rep).set_index("strategy")["train time (s)"]
    assert times["all"].endswith(" *") and not times["none"].endswith("*")
    # the console's and summary.md's tables say what * means, once per table
    from ablate.report.render import LOADED_MARK, tables

    assert tables(rep).count(LOADED_MARK) == 1 and report.markdown(rep).count(LOADED_MARK) == 1
    # the chart's seed dots are the runs its bars average
    fig = charts.train_time(rep)
    dots = [float(y) for c in fig.axes[0].collections for _, y in c.get_offsets()]
    loaded = df[(df.freeze == "none") & (df.seed == 1)].train_time_s.iloc[0]
    assert calm in dots and loaded not in dots and len(dots) == 3
    # the chart marks what the table marks, and says why; a calm grid has no mark
    marks = [t.get_text() for t in fig.axes[0].texts if t.get_text().endswith("*")]
    assert len(marks) == 1 and marks[0].endswith(" % *")  # all's; none has a calm seed
    assert "*: timed only on a loaded" in fig._suptitle.get_text()
    calm_df = df.assign(load_per_cpu=0.5)
    fig = charts.train_time(
        report.build(report.Runs(calm_df, runs.history, runs.params, runs.source))
    )
    assert not [t for t in fig.axes[0].texts if "*" in t.get_text()]
    assert "loaded" not in fig._suptitle.get_text()
    calm_rep = report.build(report.Runs(calm_df, runs.history, runs.params, runs.source))
    assert LOADED_MARK not in tables(calm_rep) + report.markdown(calm_rep)
