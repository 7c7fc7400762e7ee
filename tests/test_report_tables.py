"""The report's tables and files from the real tiny grid (tests/conftest.py's ``report_grid``):
their numbers equal MLflow's, the runs left out and why, its filters, the strategies' order."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from helpers.grid import CHART_FILES, PNG_MAGIC, epoch_seconds, logged, mean
from mlflow.tracking import MlflowClient

from ablate import report
from ablate.errors import AblateError
from ablate.report import charts, layout
from ablate.tracking.params import primary_metric


@pytest.fixture(scope="module")
def rep(report_grid) -> report.Report:
    return report.make_report("ablate", report_grid.store)


def test_cli_writes_every_chart_and_both_tables(report_cli):
    for name in [*CHART_FILES, "summary.md", "summary.csv", "runs.csv"]:
        path = report_cli.out / name
        assert path.is_file() and path.stat().st_size > 0, name
    used = pd.read_csv(report_cli.out / "runs.csv")
    assert sorted(zip(used.freeze, used.seed, strict=True)) == [
        ("all", 1), ("all", 2), ("none", 1), ("none", 2),
    ]  # fmt: skip
    assert used.git_commit.notna().all() and (used.lr == 5e-5).all() and not used.tuned.any()
    for name in CHART_FILES:
        assert (report_cli.out / name).read_bytes()[:8] == PNG_MAGIC
    md = (report_cli.out / "summary.md").read_text()
    assert all(f"]({name})" in md for name in CHART_FILES)
    assert (
        "4 runs used" in report_cli.stdout
        and "left out: UD_Naija-Slice-first2-tiny-s1" in report_cli.stdout
    )


def test_summary_numbers_equal_logged_metrics(report_grid, report_cli):
    from ablate.report.timing import loaded

    by = logged(report_grid)
    csv = pd.read_csv(report_cli.out / "summary.csv")
    assert list(csv.strategy) == ["none", "all"]  # the fixed order, baseline first
    base = by["none"]
    # times count from the runs no other work loaded (the suite may load the machine)
    frame = report.load_runs("ablate", report_grid.store, status="FINISHED").runs
    busy = set(frame.run_id[loaded(frame)])

    def timed(runs: list) -> list:
        return [r for r in runs if r.info.run_id not in busy] or runs

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
        time = mean([epoch_seconds(report_grid, r) for r in timed(runs)])
        base_time = mean([epoch_seconds(report_grid, r) for r in timed(base)])
        assert row.train_time_s == pytest.approx(time, rel=1e-12)
        runtime = mean([r.data.metrics["train_runtime_s"] for r in timed(runs)])
        assert row.trainer_runtime_s == pytest.approx(runtime, rel=1e-12)
        assert row.time_savings_pct == pytest.approx(100 * (1 - time / base_time))
        base_dev = [b.data.metrics["dev_accuracy"] for b in base]
        diffs = [100 * (x["dev_accuracy"] - b) for x, b in zip(m, base_dev, strict=True)]
        assert row.delta_dev_pt == pytest.approx(mean(diffs), abs=1e-12)
        # The markdown shows the same numbers, rounded.
        md = (report_cli.out / "summary.md").read_text()
        assert f"| {strategy} | 5e-05 | {mean(dev):.2f} ± {np.std(dev, ddof=1):.2f} | 2 |" in md


def test_history_is_mlflow_metric_history(report_grid, rep):
    for runs in logged(report_grid).values():
        for r in runs:
            got = rep.history[(rep.history.run_id == r.info.run_id)]
            for key in ("dev_accuracy", "train_loss", "epoch_time_s"):
                want = sorted((m.step, m.value) for m in report_grid.client.get_metric_history(
                    r.info.run_id, key))  # fmt: skip
                rows = got[got.key == key].sort_values("epoch")
                assert list(zip(rows.epoch, rows.value, strict=True)) == want
                assert [s for s, _ in want] == [1, 2]  # step = epoch


def test_failed_and_missing_runs_are_left_out_and_listed(rep, report_cli):
    assert "first2" not in set(rep.summary.strategy)
    ex = rep.excluded.set_index(["freeze", "seed"])
    failed = ex.loc[("first2", 1)]
    assert failed.status == "FAILED" and "out of memory" in failed.reason
    assert ex.loc[("first2", 2)].status == "MISSING"  # the report_grid's seed 2 never ran
    assert len(rep.excluded) == 2
    md = (report_cli.out / "summary.md").read_text().split("## Runs left out")[1]
    assert "UD_Naija-Slice-first2-tiny-s1" in md and "FAILED" in md and "MISSING" in md


def test_filters(report_grid):
    # the sweep: its parent's children (the four jobs and the one that failed in training); the
    # latest sweep with runs (the empty sweep after it is passed over)
    assert len(report.load_runs("ablate", report_grid.store, sweep="latest").runs) == 5
    assert (
        len(
            report.load_runs("ablate", report_grid.store, sweep=str(report_grid.tmp / "sweep")).runs
        )
        == 5
    )
    assert len(report.load_runs("ablate", report_grid.store, status="FAILED").runs) == 1
    assert len(report.load_runs("ablate", report_grid.store, model=["tiny"]).runs) == 5
    with pytest.raises(AblateError, match="no usable runs"):
        report.build(report.load_runs("ablate", report_grid.store, data="naija"))
    with pytest.raises(AblateError, match="no MLflow experiment"):
        report.load_runs("nope", report_grid.store)


def test_other_settings_make_their_own_table_and_reruns_are_left_out(report_grid):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
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


def test_a_key_one_strategy_owns_still_tells_the_others_groups_apart(report_grid):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df, params = runs.runs, dict(runs.params)
    lr = params[df.run_id[0]]["trainer.lr"]

    def copy(source: str, run_id: str, freeze: str, own: str, **changed: str) -> pd.DataFrame:
        row = df[(df.freeze == source) & (df.seed == 1)].copy()
        row["run_id"], row["freeze"], row["option_keys"] = run_id, freeze, own
        row["start_time"] = df.start_time.max() + pd.Timedelta(minutes=len(params))
        params[run_id] = {**params[df.run_id[row.index[0]]], "freeze.name": freeze, **changed}
        return row

    # the grid's sweep again with a peft method, whose option sets its own lr; first2 alone at
    # another lr
    lora = copy("none", "lora", "lora", "trainer.lr", **{"trainer.lr": "0.0005"})
    other = copy("all", "first2", "first2", "", **{"trainer.lr": "0.0001"}).assign(sweep_dir=None)
    rep = report.build(report.Runs(pd.concat([df, lora, other]), runs.history, params, runs.source))
    panels = rep.runs.groupby("panel").freeze.apply(set).to_dict()
    # the lr lora owns is not compared, first2's lr is: first2 is not compared with none; lora
    # fits both groups and joins the one of its own sweep
    assert panels == {
        f"UD_Naija-Slice · lr={lr}": {"none", "all", "lora"},
        "UD_Naija-Slice · lr=0.0001": {"first2"},
    }
    # run outside that sweep, it fits both and says so instead of joining one
    alone = lora.assign(sweep_dir=None)
    rep = report.build(
        report.Runs(pd.concat([df, alone, other]), runs.history, params, runs.source)
    )
    (reason,) = rep.excluded[(rep.excluded.freeze == "lora") & (rep.excluded.seed == 1)].reason
    assert reason.startswith(f"fits 2 groups of settings (lr={lr}; lr=0.0001), none by its own")
    assert "its option sets trainer.lr itself" in reason
    assert "lora" not in set(rep.runs.run_id)
    # a key only some runs log (a dict param's entry) is a difference, not a wildcard
    dropout = "model.config_overrides.hidden_dropout_prob"
    entry = copy("all", "dropout", "first4", "", **{dropout: "0.3"})
    params["dropout"].pop("model.config_overrides", None)
    rep = report.build(report.Runs(pd.concat([df, entry]), runs.history, params, runs.source))
    panels = rep.runs.groupby("panel").freeze.apply(set).to_dict()
    assert panels["UD_Naija-Slice · hidden_dropout_prob=0.3"] == {"first4"}


def test_runs_record_their_cpu_and_a_report_across_machines_says_so(report_grid):
    from ablate.tracking.provenance import cpu_model

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df = runs.runs
    assert set(df.cpu) == {cpu_model()} and cpu_model() not in ("", "unknown")
    rep = report.build(runs)
    assert not [n for n in rep.notes if "different machines" in n]
    # the grid's `all` runs trained elsewhere, and one of `none`'s before runs recorded a CPU
    moved = df.assign(cpu=df.cpu.where(df.freeze != "all", "Other CPU"))
    moved.loc[moved[moved.freeze == "none"].index[0], "cpu"] = None
    rep = report.build(report.Runs(moved, runs.history, runs.params, runs.source))
    (note,) = [n for n in rep.notes if "different machines" in n]
    assert f"({cpu_model()}: none" in note and "; Other CPU: all; not recorded: none)" in note
    assert note.endswith("train times and their savings compare only between runs on one machine.")


def test_seeds_timed_far_apart_make_their_times_and_savings_uncertain(report_grid):
    from ablate.report.timing import SPREAD, savings_spread

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    # idle runs with set times: none's seeds agree, all's second seed took twice its first's
    df = runs.runs.assign(load_per_cpu=0.0, busy_cpus_at_start=0.0, jobs_on_gpu=float("nan"))
    times = {("none", 1): 10.0, ("none", 2): 11.0, ("all", 1): 10.0, ("all", 2): 20.0}
    df["train_time_s"] = [times.get((f, s), 10.0) for f, s in zip(df.freeze, df.seed, strict=True)]
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    spread = rep.summary.set_index("strategy").train_time_spread
    assert spread["none"] == pytest.approx(1.1) and spread["all"] == pytest.approx(2.0)
    (note,) = [n for n in rep.notes if "apart in time" in n]
    assert f"more than {SPREAD:g}x apart in time (slowest / fastest: all 2.00x)" in note
    # the baseline's saving rests on its own time, all's on both
    assert list(savings_spread(rep.summary)) == pytest.approx([1.1, 2.0])
    fig = charts.train_time(rep)  # the chart marks all's saving as uncertain, and says why
    assert [t.get_text() for t in fig.axes[0].texts if t.get_text().endswith(" ?")] == ["+43 % ?"]
    assert "?: its or none's times over 1.25x apart" in fig.get_suptitle().replace("\n", " ")
    plt.close(fig)
    df["train_time_s"] = [10.0 + s / 10 for s in df.seed]  # every strategy's seeds agree
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    assert not [n for n in rep.notes if "apart in time" in n]


def test_a_run_records_its_cpus_speed_and_the_report_compares_times_of_like_speed(
    report_grid, slice_root, store, monkeypatch
):
    from helpers.data import ROOT
    from helpers.runs import compose_cfg, fit_here, slice_overrides

    from ablate.report.timing import savings_spread
    from ablate.training.callbacks import EpochLogger

    monkeypatch.setattr(EpochLogger, "PROBE_FROM_S", 0.0)  # the slice's epochs are short
    base = [o for o in slice_overrides(slice_root, store, ROOT) if not o.startswith("hydra.")]
    run_id, _ = fit_here(compose_cfg(*base, "freeze=all"))
    probes = [m.value for m in MlflowClient(store).get_metric_history(run_id, "cpu_gflops")]
    assert len(probes) == 2 and all(p > 0.1 for p in probes)  # one after each epoch
    (row,) = report.load_runs("ablate", store).runs.itertuples()
    assert row.cpu_gflops == pytest.approx(float(np.median(probes)))

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    assert runs.runs.cpu_gflops.isna().all()  # the grid's epochs are shorter than the probe's
    df = runs.runs.assign(load_per_cpu=0.0, busy_cpus_at_start=0.0, train_time_s=10.0)
    df["cpu_gflops"] = [100.0 if f == "none" else 101.0 for f in df.freeze]
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    assert not [n for n in rep.notes if "speeds" in n]
    faster = df.freeze != "none"
    df["cpu_gflops"] = (170.0 + df.seed.astype(float)).where(faster, 100.0)
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    (note,) = [n for n in rep.notes if "speeds" in n]
    assert "(a matrix-product probe after each epoch: none 100, all 171-172 GFLOP/s)" in note
    assert list(savings_spread(rep.summary)) == pytest.approx([1.0, 1.72])
    df.loc[df.freeze == "none", "cpu_gflops"] = float("nan")  # runs from before the probe
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    (note,) = [n for n in rep.notes if "speeds" in n]
    assert "all 171-172 GFLOP/s; not recorded: none)" in note
    assert list(savings_spread(rep.summary)) == [1.0, float("inf")]  # all's speed unknown


def test_a_peak_that_may_hold_earlier_jobs_memory_is_marked(report_grid):
    from ablate.report.render import CARRIED_MARK, markdown, table

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df = runs.runs
    # the grid's jobs ran in one process: each reset the process's peak as it started
    assert (df.peak_rss_scope == "job").all() and df.job_num.max() > 0
    assert "†" not in markdown(report.build(runs))
    # runs recorded before ablate reset it: a later job's peak is marked, a first job's is not
    old = df.assign(peak_rss_scope=None, job_num=df.job_num.where(df.freeze != "none", 0))
    rep = report.build(report.Runs(old, runs.history, runs.params, runs.source))
    shown = table(rep).set_index("strategy")["peak memory (MiB)"]
    assert shown["all"].endswith(" †") and not shown["none"].endswith("†")
    assert CARRIED_MARK.split(":")[0] in markdown(rep)


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
