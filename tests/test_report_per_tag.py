"""A word-tagging report's per-tag accuracy (summary.md's section, per_tag.csv) and confusion
chart, on the real tiny grid (tests/conftest.py): recomputed from each run's logged predictions,
read back from MLflow here; and what the report says where runs logged none."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from helpers.charts import overlaps
from helpers.grid import PNG_MAGIC, copy_grid, logged, mean
from helpers.store import logged as artifact

from ablate import report
from ablate.report import charts, per_tag
from ablate.report.render import CHARTS, charts_of
from ablate.tasks.pos import UPOS


def _per_tag(gold: list[int], pred: list[int]) -> dict[str, float]:
    """Each gold tag's share of words predicted right (%), by the tag's UPOS name."""
    gold_, pred_ = np.asarray(gold), np.asarray(pred)
    return {UPOS[t]: 100 * float(np.mean(pred_[gold_ == t] == t)) for t in np.unique(gold_)}


def test_per_tag_accuracy_is_each_tags_share_of_its_words_in_the_logged_predictions(
    report_grid, report_cli, tmp_path
):
    table = pd.read_csv(report_cli.out / "per_tag.csv")
    md = (report_cli.out / "summary.md").read_text()
    section = md.split("## Per-tag accuracy\n")[1].split("## Charts")[0]
    by = logged(report_grid)
    for split in ("dev", "test"):
        means = {}
        for strategy, runs in by.items():
            ids = [artifact(report_grid.store, r.info.run_id, tmp_path / r.info.run_id,
                            f"predictions/{split}.json") for r in runs]  # fmt: skip
            per_run = [_per_tag(**x) for x in ids]
            got = table[(table.strategy == strategy) & (table.split == split)].set_index("tag")
            # the task's tags in its order, those with gold words in the split
            assert list(got.index) == [t for t in UPOS if t in per_run[0]]
            means[strategy] = {t: mean([p[t] for p in per_run]) for t in got.index}
            assert got.accuracy_pct.to_dict() == pytest.approx(means[strategy], abs=1e-9)
            assert (got.n == len(runs)).all()
            # the tags' accuracies weighted by their words are the run's logged accuracy
            words = got.words
            assert words.sum() == runs[0].data.metrics[f"{split}_words"]
            overall = mean([r.data.metrics[f"{split}_accuracy"] for r in runs])
            assert (got.accuracy_pct * words).sum() / words.sum() == pytest.approx(100 * overall)
        delta = table[(table.strategy == "all") & (table.split == split)].set_index("tag").delta_pt
        assert delta.to_dict() == pytest.approx(
            {t: means["all"][t] - means["none"][t] for t in delta.index}, abs=1e-9
        )
        # summary.md shows the same numbers, rounded, a column per strategy
        assert f"### UD_Naija-Slice — model tiny, 2 epochs ({split})" in section
        for tag, none in means["none"].items():
            words = int(table[(table.tag == tag) & (table.split == split)].words.iloc[0])
            assert f"| {tag} | {words} | {none:.1f} | {means['all'][tag]:.1f} |" in section
    assert "No per-tag numbers" not in section  # every run logged both splits' predictions
    assert "![confusion](confusion.png)" in md
    assert (report_cli.out / "confusion.png").read_bytes()[:8] == PNG_MAGIC


def test_the_confusion_chart_shows_the_baseline_the_best_other_strategy_and_their_difference(
    report_grid,
):
    rep = report.make_report("ablate", report_grid.store)
    assert per_tag.shown(rep) == [("UD_Naija-Slice", "test", ["none", "all"])]
    fig = charts.confusion(rep)
    heatmaps = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in heatmaps] == [
        "UD_Naija-Slice\nnone (baseline): % of each gold tag's test words",
        "UD_Naija-Slice\nall: % of each gold tag's test words",
        "UD_Naija-Slice\nall − none (pt)",
    ]
    none, all_ = (rep.per_tag.confusion["UD_Naija-Slice", s, "test"] for s in ("none", "all"))
    table = rep.per_tag.table.query("split == 'test' and strategy == 'none'").set_index("tag")
    for frame in (none, all_):
        rows = frame.dropna(how="all")
        assert list(rows.index) == list(table.index)  # the tags with gold words
        assert rows.sum(axis=1).to_numpy() == pytest.approx(100)  # each row: its tag's words
    assert np.diag(none.loc[table.index, table.index]) == pytest.approx(table.accuracy_pct)
    # each cell's number is its share rounded, blank under half a point
    for ax, frame, form in ((heatmaps[0], none, "{:.0f}"), (heatmaps[2], all_ - none, "{:+.0f}")):
        said = sorted(t.get_text() for t in ax.texts)
        want = sorted(form.format(v) for v in frame.to_numpy().ravel() if abs(v) >= 0.5)
        assert said == want
    assert [t.get_text() for t in heatmaps[0].get_yticklabels()][:2] == [
        f"{tag} ({table.words.get(tag, 0):,.0f})" for tag in UPOS[:2]
    ]
    assert overlaps(fig) == []
    plt.close(fig)
    # without a baseline run, the best strategy alone
    rep = report.build(report.load_runs("ablate", report_grid.store), baseline="first4")
    assert per_tag.shown(rep) == [("UD_Naija-Slice", "test", ["none"])]
    fig = charts.confusion(rep)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "UD_Naija-Slice\nnone: % of each gold tag's test words"
    ]
    plt.close(fig)


def _drop_predictions(grid, split: str, strategies: set[str]) -> None:
    """Delete the logged predictions on ``split`` of ``strategies``' runs in ``grid``'s store."""
    for run in grid.runs:
        if run.data.params.get("freeze.name") in strategies and run.info.status == "FINISHED":
            folder = Path(urlparse(grid.client.get_run(run.info.run_id).info.artifact_uri).path)
            (folder / "predictions" / f"{split}.json").unlink()


def test_runs_without_predictions_get_no_per_tag_numbers_and_one_note(
    report_grid, report_cli, tmp_path
):
    grid = copy_grid(report_grid, tmp_path)
    _drop_predictions(grid, "test", {"all"})
    rep = report.make_report("ablate", grid.store)
    table = rep.per_tag.table
    assert set(table[table.split == "dev"].strategy) == {"none", "all"}
    assert set(table[table.split == "test"].strategy) == {"none"}
    md = report.markdown(rep)
    assert md.count("No per-tag numbers") == 1
    note = "No per-tag numbers (none estimated) for UD_Naija-Slice, test: all (no predictions "
    assert f"{note}logged)." in md
    # the chart falls back to dev, where both strategies have their confusions
    assert per_tag.shown(rep) == [("UD_Naija-Slice", "dev", ["none", "all"])]

    # no predictions at all: the note alone, no per_tag.csv, no confusion chart (an earlier
    # report's in the folder removed: it would pass for this one's)
    _drop_predictions(grid, "test", {"none"})
    _drop_predictions(grid, "dev", {"none", "all"})
    rep = report.make_report("ablate", grid.store)
    assert rep.per_tag.table.empty and charts_of(rep) == CHARTS
    out = tmp_path / "report"
    shutil.copytree(report_cli.out, out)
    paths = report.write(rep, out)
    assert "per_tag.csv" not in paths
    assert not (out / "per_tag.csv").exists() and not (out / "confusion.png").exists()
    md = (out / "summary.md").read_text()
    assert "confusion.png" not in md and md.count("No per-tag numbers") == 1
    assert (
        "for UD_Naija-Slice, dev: every strategy (no predictions logged); UD_Naija-Slice, test: "
        "every strategy (no predictions logged)." in md
    )
    assert "| ADJ |" not in md


def test_only_word_tagging_tasks_get_per_tag_numbers(report_grid):
    assert per_tag.labels_of("pos") == UPOS
    assert per_tag.labels_of("ner") is None  # entity F1: a tag's accuracy is not its score
    assert per_tag.labels_of("sst2") is None and per_tag.labels_of(None) is None
    rep = report.build(report.load_runs("ablate", report_grid.store), predictions=False)
    assert rep.per_tag is None and "## Per-tag accuracy" not in report.markdown(rep)
