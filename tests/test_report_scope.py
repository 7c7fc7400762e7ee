"""Which runs the report covers (the latest sweep that has runs, a sweep's reused runs), its
one-line errors, and the settings its headings and charts name; on a real tiny multirun."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from helpers.grid import copy_grid
from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs, sweep_parents
from mlflow.tracking import MlflowClient

from ablate import report
from ablate.report import charts, cli, layout, recipe
from ablate.report.render import tables
from ablate.report.scope import REUSED


@pytest.fixture(scope="module")
def grid(report_grid, tmp_path_factory) -> SimpleNamespace:
    """A copy of the report tests' grid (tests/conftest.py; these tests add runs and sweeps to
    its store): a sweep of none, all x seeds 1, 2 and, after it, a FAILED sweep with no run.
    ``seed1``: the sweep's seed-1 runs by strategy."""
    grid = copy_grid(report_grid, tmp_path_factory.mktemp("scope"))
    grid.seed1 = {
        r.data.params["freeze.name"]: r
        for r in grid.runs
        if r.info.status == "FINISHED" and r.data.params["seed"] == "1"
    }
    assert sorted(grid.seed1) == ["all", "none"]
    return grid


def _error(capsys, *args: str) -> str:
    """``python -m ablate.report ARGS`` (in this process) failing: its one line on stderr."""
    assert cli.main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err and "{'" not in err  # no dict, no traceback
    return err


def test_the_default_report_skips_a_sweep_that_ran_no_job(report_grid, report_cli):
    # the grid's latest sweep ran no job: the report is the sweep before it
    assert "4 runs used" in report_cli.stdout
    used = pd.read_csv(report_cli.out / "runs.csv")
    finished = [r.info.run_id for r in report_grid.runs if r.info.status == "FINISHED"]
    assert sorted(used.run_id) == sorted(finished)
    assert f"sweep={report_grid.sweep}" in (report_cli.out / "summary.md").read_text()


def test_every_error_is_one_line_naming_the_fix(grid, capsys, tmp_path):
    sweeps = f"its latest sweeps with runs: {grid.sweep} (5 runs, started "
    err = _error(capsys, "--uri", grid.store, "--sweep", str(grid.typo))
    assert "(every job failed before its run opened)" in err and sweeps in err
    assert "pass one of their folders to --sweep, or --all for every run" in err
    err = _error(capsys, "--uri", grid.store, "--sweep", str(tmp_path))
    assert f"no sweep ran in {tmp_path}" in err and sweeps in err
    err = _error(capsys, "--uri", grid.store, "--experiment", "nope")
    assert "no MLflow experiment 'nope'" in err
    assert "its experiments: ablate: pass one with --experiment" in err
    err = _error(capsys, "--uri", grid.store, "--data", "nope")
    assert "no usable runs in experiment 'ablate'" in err and "it holds no run" in err
    assert "--all (every run of the experiment)" in err and sweeps in err
    assert "FINISHED runs by dataset: UD_Naija-Slice (4)" in err
    err = _error(capsys, "--uri", grid.store, "--status", "FAILED", "--all")
    assert "no usable runs" in err and "--data/--model/--status" in err
    missing = tmp_path / "none.db"
    err = _error(capsys, "--uri", f"sqlite:///{missing}")
    assert f"no MLflow store at {missing}" in err and "--uri" in err
    assert not missing.exists()  # reading creates no store
    path = grid.store.removeprefix("sqlite:///")
    err = _error(capsys, "--uri", path)
    assert "not readable" in err and f"pass a sqlite file as --uri {grid.store}" in err
    # with no sweep that has runs, the default reports every run and says so
    client = MlflowClient(grid.store)
    exp = client.create_experiment("loose")
    run = client.create_run(exp, run_name="one").info.run_id
    client.set_terminated(run, "FINISHED")
    assert cli.main(["--uri", grid.store, "--experiment", "loose"]) == 2
    out, err = capsys.readouterr()
    assert "no sweep with runs in this experiment: the report covers every run (as --all)" in out
    assert err.count("\n") == 1 and "no usable runs" in err
    assert "one: not an ablate training run" in err and "it holds no sweep with runs" in err


def test_headings_and_charts_name_the_settings_beyond_the_defaults(grid):
    rep = report.make_report("ablate", grid.store, sweep=str(grid.sweep))
    # the tiny model and 2 epochs; data.root, the treebank, the seed: no setting or named
    assert set(rep.summary.settings) == {"model tiny, 2 epochs"}
    assert "## UD_Naija-Slice — model tiny, 2 epochs\n" in report.markdown(rep)
    assert tables(rep).startswith("UD_Naija-Slice — model tiny, 2 epochs:\n")
    for name in report.CHARTS:
        fig = getattr(charts, name)(rep)
        title = fig.get_suptitle()
        assert title.endswith("\nSettings beyond the defaults: model tiny, 2 epochs"), name
        plt.close(fig)


def test_settings_in_words_against_the_composed_defaults():
    asked = {"trainer.lr": "0.0001", "data.max_train_sentences": "200", "trainer.epochs": "2",
             "trainer.batch_size": "16", "trainer.warmup_ratio": "0.06"}  # fmt: skip
    assert recipe.describe(asked, "naija", "minilm") == (
        "2 epochs, 200 training sentences, lr 0.0001, warmup_ratio=0.06"
    )
    # conll2003 is cased by its own option; bert_base_cased is no default model
    cased = {"data.lowercase": "False", "trainer.epochs": "5", "model.head": "bilstm"}
    assert recipe.describe(cased, "conll2003", "bert_base_cased") == (
        "model bert_base_cased, head=bilstm"
    )
    assert recipe.describe(cased, "conll2003", "x", name_model=False) == "head=bilstm"
    ud = {"data.treebank": "UD_Naija-Slice", "data.dir": "ud/UD_Naija-Slice"}
    assert recipe.describe(ud, "UD_Naija-Slice", "minilm") == recipe.DEFAULTS


def test_panels_of_two_datasets_name_no_settings_they_share(grid):
    """Runs of two datasets under the same recipe: a panel each, named by the dataset alone."""
    runs = report.load_runs("ablate", grid.store, sweep=str(grid.sweep))
    df, params = runs.runs, dict(runs.params)
    ewt = df.assign(run_id=df.run_id + "-ewt", data="ewt")
    for r in ewt.itertuples():
        params[r.run_id] = {
            **params[r.run_id.removesuffix("-ewt")], "data.name": "ewt",
            "data.treebank": "UD_English-EWT", "data.dir": "ud/UD_English-EWT",
        }  # fmt: skip
    both = report.Runs(pd.concat([df, ewt], ignore_index=True), runs.history, params, runs.source)
    rep = report.build(both, predictions=False)
    assert list(rep.summary.panel.unique()) == ["UD_Naija-Slice", "ewt"]
    assert set(rep.summary.settings) == {"model tiny, 2 epochs"}


def test_the_latest_sweep_with_runs_is_the_default_of_the_library_too(grid):
    assert Path(report.load_runs("ablate", grid.store, sweep="latest").source["sweep"]) == (
        grid.sweep
    )


def test_a_sweep_that_reused_finished_runs_reports_over_them(grid):
    """A sweep started again with skip_finished=true: its jobs reuse the first sweep's runs
    (tags ``ablate.reused.<job>``); one job ran again and failed in training."""
    client = MlflowClient(grid.store)
    exp = client.get_experiment_by_name("ablate").experiment_id
    folder = grid.tmp / "again"
    parent = client.create_run(
        exp, run_name="sweep seed=1",
        tags={"ablate.role": "sweep", "hydra.sweep_dir": str(folder)},
    ).info.run_id  # fmt: skip
    none, all_ = grid.seed1["none"].info.run_id, grid.seed1["all"].info.run_id
    client.set_tag(parent, f"{REUSED}0", none)
    client.set_tag(parent, f"{REUSED}1", all_)
    gone = client.create_run(exp).info.run_id  # a reused run deleted since
    client.delete_run(gone)
    client.set_tag(parent, f"{REUSED}3", gone)
    failed = client.create_run(exp, run_name="again-first2", tags={"mlflow.parentRunId": parent})
    for key, value in {**grid.seed1["all"].data.params, "freeze.name": "first2"}.items():
        client.log_param(failed.info.run_id, key, value)
    client.set_terminated(failed.info.run_id, "FAILED")
    client.set_terminated(parent, "FAILED")

    want = {none, all_, failed.info.run_id}
    assert set(report.load_runs("ablate", grid.store, parent=parent).runs.run_id) == want
    assert set(report.load_runs("ablate", grid.store, sweep=str(folder)).runs.run_id) == want
    assert set(report.load_runs("ablate", grid.store, sweep="latest").runs.run_id) == want
    rep = report.build(report.load_runs("ablate", grid.store, parent=parent))
    assert set(rep.runs.run_id) == {none, all_}
    assert list(rep.excluded.reason) == ["FAILED"]
    dev = rep.summary.set_index("strategy").dev_mean_pct
    assert dev["all"] == pytest.approx(100 * grid.seed1["all"].data.metrics["dev_accuracy"])
    # a sweep whose every job was reused: no child at all
    only = client.create_run(exp, tags={"ablate.role": "sweep", "hydra.sweep_dir": "x"}).info
    client.set_tag(only.run_id, f"{REUSED}0", none)
    assert list(report.load_runs("ablate", grid.store, parent=only.run_id).runs.run_id) == [none]
    client.delete_run(only.run_id)
    client.delete_run(parent)  # the other tests' latest sweep stays the first


def test_a_finished_sweep_run_again_reports_over_the_runs_it_reused(grid, slice_root, capsys):
    """The same grid again with skip_finished=true: no job trains, the sweep records the runs
    it reused, and both its own report and ``--sweep <its folder>`` cover them."""
    folder = grid.tmp / "rerun"
    overrides = [o for o in slice_overrides(slice_root, grid.store, grid.tmp)
                 if not o.startswith("hydra.sweep.dir")]  # fmt: skip
    proc = run_cli(
        "--multirun", "freeze=none,all", "seed=1", *overrides, f"hydra.sweep.dir={folder}",
        "skip_finished=true", cwd=grid.tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| none |" in proc.stdout and "| all |" in proc.stdout  # the sweep's own report
    finished = [r for r in logged_runs(grid.store) if r.info.status == "FINISHED"]
    assert len(finished) == 4  # nothing trained again
    (parent,) = [p for p in sweep_parents(grid.store) if p.data.tags["hydra.sweep_dir"] == str(
        folder)]  # fmt: skip
    ids = {r.info.run_id for r in grid.seed1.values()}
    assert {v for k, v in parent.data.tags.items() if k.startswith(REUSED)} == ids
    out = grid.tmp / "rerun-report"
    assert cli.main(["--uri", grid.store, "--sweep", str(folder), "--out", str(out)]) == 0
    assert "2 runs used" in capsys.readouterr().out
    assert set(pd.read_csv(out / "runs.csv").run_id) == ids
    assert set(report.load_runs("ablate", grid.store, sweep="latest").runs.run_id) == ids


def _datasets(runs, names: list[str]) -> report.Runs:
    """The sweep's runs again under each of ``names`` as its dataset: a panel each."""
    df, params, frames = runs.runs, dict(runs.params), []
    for name in names:
        copy = df.assign(run_id=df.run_id + f"-{name}", data=name)
        for r in copy.itertuples():
            params[r.run_id] = {**params[r.run_id.removesuffix(f"-{name}")], "data.name": name}
        frames.append(copy)
    history = pd.concat(
        [runs.history.assign(run_id=runs.history.run_id + f"-{n}", data=n) for n in names]
    )
    return report.Runs(pd.concat(frames, ignore_index=True), history, params, runs.source)


def test_charts_of_many_panels_wrap_into_rows_readable_at_page_width(grid, tmp_path):
    from helpers.charts import overlaps

    runs = report.load_runs("ablate", grid.store, sweep=str(grid.sweep))
    rep = report.build(_datasets(runs, [f"treebank{i}" for i in range(8)]), predictions=False)
    assert rep.summary.panel.nunique() == 8
    for name in report.CHARTS:
        fig = getattr(charts, name)(rep)
        width, height = fig.get_size_inches()
        assert width <= layout.PAGE_W, name  # not 8 panels in one row
        tops = {round(ax.get_position().y1, 2) for ax in fig.axes if ax.get_title()}
        assert len(tops) >= 3, name  # rows of panels, a title on each
        assert overlaps(fig) == [], name
        fig.savefig(tmp_path / f"{name}.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
    from PIL import Image

    with Image.open(tmp_path / "accuracy.png") as png:
        assert png.width <= 2400 and png.height > png.width / 2  # a page, not a strip


HOSTILE = "x\n| planted | row |\n![pixel](http://evil.example/p.png) <img src=x>"


def test_a_hostile_run_value_stays_text_in_the_tables_the_headings_and_the_notes(grid):
    """An option or dataset name a co-editor chose: every table (the console's, the sweep's
    description, summary.md), heading and note shows it as text in its own cell."""
    runs = report.load_runs("ablate", grid.store, sweep=str(grid.sweep))
    one = runs.runs[runs.runs.seed == 1].reset_index(drop=True)
    history = runs.history[runs.history.run_id.isin(one.run_id)]
    hostile = _datasets(report.Runs(one, history, runs.params, runs.source), [f"ewt {HOSTILE}"])
    hostile.runs.loc[hostile.runs.freeze == "all", "freeze"] = f"all {HOSTILE}"
    rep = report.build(hostile, predictions=False)
    assert rep.notes  # one seed: a note that names the panel
    for text in (tables(rep), tables(rep, short=True), report.markdown(rep)):
        lines = text.splitlines()
        assert not [
            ln for ln in lines if ln.startswith(("| planted", "![pixel", "<img", "## planted"))
        ]
        assert "](http" not in text.replace("\\](", "") and "<img" not in text.replace("\\<", "")
        assert sum(ln.startswith("| all x \\| planted \\| row \\| ") for ln in lines) == 1
