"""The report's charts on the real tiny grid: readable (no two texts overlap) with every
strategy ablate knows, and times measured on a loaded machine marked as in the tables."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers.charts import overlaps

from ablate import report
from ablate.report import charts


def test_charts_of_a_one_epoch_one_seed_grid_of_every_strategy_are_readable(report_grid):
    import matplotlib.pyplot as plt

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    base = runs.runs[(runs.runs.seed == 1)].reset_index(drop=True)
    frames, params = [], dict(runs.params)
    for i, strategy in enumerate(report.STRATEGY_ORDER):  # every strategy ablate knows
        row = base.iloc[[i % len(base)]].copy()
        row["freeze"], row["run_id"] = strategy, f"{strategy}-1"
        row["train_time_s"] = row.train_time_s * (1 - i / 20)  # a saving to label on each bar
        params[f"{strategy}-1"] = params[base.run_id.iloc[i % len(base)]]
        frames.append(row)
    one = pd.concat(frames, ignore_index=True)
    history = runs.history[runs.history.epoch == 1].copy()  # a 1-epoch report_grid
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


def test_the_accuracy_charts_legend_covers_no_strategys_marks(report_grid):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df = runs.runs.copy()
    df.loc[df.freeze == "none", "dev"] /= 2  # the first strategy's marks far below the other's
    fig = charts.accuracy(report.build(report.Runs(df, runs.history, runs.params, runs.source)))
    assert fig.axes[0].get_legend() is not None
    assert overlaps(fig) == []


def _loaded_marks(fig) -> list[str]:
    """The time chart's labels that carry the loaded mark, without the uncertain one (` ?`)
    that the tests' own runs earn or not by how busy the machine running the suite was."""
    labels = (t.get_text().removesuffix(" ?") for t in fig.axes[0].texts)
    return [label for label in labels if label.endswith("*")]


def test_times_measured_on_a_loaded_machine_are_left_out_where_calm_ones_exist(report_grid):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df = runs.runs.assign(busy_cpus_at_start=0.0)  # each started on an idle machine
    busy = (df.freeze == "none") & (df.seed == 1) | (df.freeze == "all")
    df.loc[busy, "load_per_cpu"] = 3.0
    df.loc[~busy, "load_per_cpu"] = 0.5
    # none's runs probed their CPU's speed, all's did not: all's saving is uncertain too (?)
    df["cpu_gflops"] = (df.freeze == "none").map({True: 100.0, False: float("nan")})
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
    # the chart marks what the table marks, and says why; a calm report_grid has no mark
    marks = _loaded_marks(fig)
    assert len(marks) == 1 and marks[0].endswith(" % *")  # all's; none has a calm seed
    assert [t.get_text() for t in fig.axes[0].texts if t.get_text().endswith(" % * ?")]
    assert "*: timed only on a loaded" in fig._suptitle.get_text()
    calm_df = df.assign(load_per_cpu=0.5)
    fig = charts.train_time(
        report.build(report.Runs(calm_df, runs.history, runs.params, runs.source))
    )
    assert not [t for t in fig.axes[0].texts if "*" in t.get_text()]
    assert "loaded" not in fig._suptitle.get_text()
    calm_rep = report.build(report.Runs(calm_df, runs.history, runs.params, runs.source))
    assert LOADED_MARK not in tables(calm_rep) + report.markdown(calm_rep)


def test_a_panel_whose_times_come_from_several_machines_says_so_on_the_time_chart(report_grid):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df = runs.runs.assign(busy_cpus_at_start=0.0, load_per_cpu=0.5)
    titles = [a.get_title() for a in charts.train_time(report.build(runs)).axes[:1]]
    assert "several machines" not in titles[0]  # the grid's runs trained here, on one CPU
    moved = df.assign(cpu=df.cpu.where(df.freeze != "all", "Other CPU"))
    rep = report.build(report.Runs(moved, runs.history, runs.params, runs.source))
    title = charts.train_time(rep).axes[0].get_title()
    assert title.endswith("times from several machines (the report's notes say which)")
    assert [n for n in rep.notes if "different machines" in n]


def test_the_charts_source_line_names_the_baseline_only_where_its_runs_are(report_grid):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")

    def source(rep) -> str:
        fig = charts.accuracy(rep)
        return next(t.get_text() for t in fig.texts if t.get_text().startswith("Source:"))

    assert source(report.build(runs)).endswith("baseline = none.")
    df = runs.runs[runs.runs.freeze != "none"]
    without = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    assert source(without).endswith("no none run, so no baseline.")


def test_a_saving_against_a_loaded_baseline_is_marked_and_a_resumed_runs_wall_time_left_out(
    report_grid,
):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    df = runs.runs.assign(busy_cpus_at_start=0.0, load_per_cpu=0.5)
    df.loc[df.freeze == "none", "load_per_cpu"] = 3.0  # every baseline seed timed beside work
    resumed = (df.freeze == "all") & (df.seed == 1)
    df.loc[resumed, "resumed"] = True  # its MLflow run reopened: its span holds a stop
    df.loc[resumed, "wall_s"] = 7200.0
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    row = report.table(rep).set_index("strategy").loc["all"]
    assert not row["train time (s)"].endswith("*")  # its own times were calm
    assert row["time savings vs none (%)"].endswith(" *")  # against the loaded baseline's
    other = df[(df.freeze == "all") & ~resumed].wall_s.mean()
    assert rep.summary.set_index("strategy").loc["all"].wall_s == pytest.approx(other)
    fig = charts.train_time(rep)
    marks = _loaded_marks(fig)
    assert len(marks) == 2 and any(m.endswith(" % *") for m in marks)  # all's saving too
    # a timed run without its time: no train time, and no saving from the other seeds alone
    df.loc[resumed, "train_time_s"] = float("nan")
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    row = report.table(rep).set_index("strategy").loc["all"]
    assert row["train time (s)"] == "–" and row["time savings vs none (%)"].startswith("–")


def test_times_of_jobs_that_shared_a_gpu_are_marked_as_a_loaded_machines(report_grid):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    assert "jobs_on_gpu" in runs.runs  # a metric the runs of a GPU sweep's workers log
    df = runs.runs.assign(load_per_cpu=0.5, busy_cpus_at_start=0.0)
    df["jobs_on_gpu"] = (df.freeze == "all").map({True: 8.0, False: float("nan")})  # CPU: unset
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    times = report.table(rep).set_index("strategy")["train time (s)"]
    assert times["all"].endswith(" *") and not times["none"].endswith("*")
    (note,) = [n for n in rep.notes if "loaded machine" in n]
    assert "up to 8 jobs sharing a GPU" in note and "threads per CPU" not in note
    assert rep.summary.set_index("strategy").loc["all"].jobs_on_gpu == 8


def test_times_of_runs_that_started_beside_other_work_are_marked_as_a_loaded_machines(
    report_grid,
):
    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    assert "busy_cpus_at_start" in runs.runs  # sampled by trainer.omp_wait_policy=auto
    # later epochs on an idle machine, but OpenMP chose to wait passively at the start
    df = runs.runs.assign(load_per_cpu=0.5, busy_cpus_at_start=0.1)
    df.loc[df.freeze == "all", "busy_cpus_at_start"] = 2.0
    rep = report.build(report.Runs(df, runs.history, runs.params, runs.source))
    times = report.table(rep).set_index("strategy")["train time (s)"]
    assert times["all"].endswith(" *") and not times["none"].endswith("*")
    (note,) = [n for n in rep.notes if "loaded machine" in n]
    assert "up to 2.0 CPUs busy at a run's start" in note and "threads per CPU" not in note


def test_a_gpu_sweeps_workers_say_how_many_jobs_share_each_gpu(monkeypatch):
    from ablate.training import resources

    monkeypatch.setenv(resources.SHARING, "")  # restored after: share_gpus sets it
    assert resources.jobs_on_gpu("cpu") == 1 and resources.jobs_on_gpu("cuda") == 1  # no sweep
    resources.share_gpus(8, 1)
    assert resources.jobs_on_gpu("cuda:0") == 8 and resources.jobs_on_gpu("cpu") == 1
    resources.share_gpus(6, 4)  # six workers taking four GPUs in turn: at most two on one
    assert resources.jobs_on_gpu("cuda") == 2


def test_the_time_charts_seed_dots_sit_alike_each_time_it_is_drawn(report_grid):
    import matplotlib.pyplot as plt
    import numpy as np

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    rep = report.build(report.Runs(runs.runs, runs.history, runs.params, runs.source))

    def dots(seed: int) -> list[tuple[float, float]]:
        np.random.seed(seed)  # whatever NumPy's global state, the chart is the same
        fig = charts.train_time(rep)
        kept = np.random.randint(1 << 30)  # the state drawing left as it found it
        np.random.seed(seed)
        assert kept == np.random.randint(1 << 30)
        out = [(float(x), float(y)) for c in fig.axes[0].collections for x, y in c.get_offsets()]
        plt.close(fig)
        return out

    first = dots(1)
    assert len({x for x, _ in first}) == len(first) > 1  # jittered beside their bars
    assert dots(2) == first


def test_the_time_charts_seed_dots_show_on_the_baselines_dark_bar(report_grid):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    runs = report.load_runs("ablate", report_grid.store, status="FINISHED")
    fig = charts.train_time(report.build(runs))
    bars = {to_rgba(p.get_facecolor())[:3] for p in fig.axes[0].patches}
    dots = [c for c in fig.axes[0].collections if len(c.get_offsets())]
    assert dots and all(
        (c.get_edgecolor()[:, :3] == 1.0).all() and not {tuple(c.get_facecolor()[0][:3])} & bars
        for c in dots
    )  # a white ring around each, whatever bar lies under it
    plt.close(fig)


def test_a_strategy_at_chance_level_is_said_and_the_chance_line_drawn(report_grid):
    import numpy as np

    from ablate.report.chance import MARGIN_PT
    from ablate.report.stats import load_predictions

    rep = report.build(report.load_runs("ablate", report_grid.store, status="FINISHED"))
    gold, _ = load_predictions(report_grid.store, rep.runs.run_id.iloc[0])
    counts = np.unique(gold, return_counts=True)[1]
    chance = 100 * counts.max() / counts.sum()  # always the most frequent dev tag
    assert rep.summary.chance_pct.tolist() == pytest.approx([chance] * len(rep.summary))
    near = rep.summary.dev_mean_pct <= chance + MARGIN_PT
    assert rep.summary.at_chance.tolist() == near.tolist()
    said = [n for n in rep.notes if "sits at chance level" in n]
    assert len(said) == near.sum()
    for r in rep.summary[near].itertuples():
        assert any(f"`{r.strategy}` scores {r.dev_mean_pct:.2f} %" in n for n in said)

    def chance_lines(summary) -> list:
        shown = report.Report(**{**rep.__dict__, "summary": summary})
        (ax, *_) = charts.accuracy(shown).axes
        return [line for line in ax.lines if str(line.get_label()).startswith("chance")]

    drawn = chance_lines(rep.summary.assign(at_chance=[True] + [False] * (len(rep.summary) - 1)))
    assert len(drawn) == 1 and drawn[0].get_ydata()[0] == pytest.approx(chance)
    assert chance_lines(rep.summary.assign(at_chance=False)) == []  # far above it: not drawn
