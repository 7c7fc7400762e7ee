"""Per-tag accuracy and confusions of a task that tags words and scores them by accuracy
(``pos``): each run's logged predictions (``predictions/<split>.json``: gold and predicted label
ids) counted tag by tag (scikit-learn's confusion matrix), the ids named by the task's labels
(``ablate.tasks``), each strategy's mean over its seeds (``per_tag``); the tables of
``summary.md`` (``markdown``) and the pairs the confusion chart shows (``shown``). A strategy
whose runs did not all log their predictions on a split has no per-tag number there: the
section's one note names it (``lacking``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.metrics import confusion_matrix

from ablate import tasks
from ablate.report.recipe import heading
from ablate.report.stats import Predictions
from ablate.tables import inline, markdown_table

SPLITS = ("dev", "test")
COLUMNS = [
    "panel", "data", "model", "strategy", "split", "tag", "words", "n",
    "accuracy_pct", "accuracy_std_pct", "delta_pt",
]  # fmt: skip
NONE = "no predictions logged"


@dataclass
class PerTag:
    """``table``: a row per panel x strategy x split x tag with gold words there (``COLUMNS``:
    ``words`` its gold words, ``n`` the seeds, ``delta_pt`` the difference from the baseline's
    accuracy on that tag); ``confusion``: by (panel, strategy, split), the share (%) of each gold
    tag's words (rows) predicted as each tag (columns), mean over seeds; ``lacking``: (panel,
    split, strategy, why) without per-tag numbers."""

    table: pd.DataFrame
    confusion: dict[tuple[str, str, str], pd.DataFrame] = field(default_factory=dict)
    lacking: list[tuple[str, str, str, str]] = field(default_factory=list)


def labels_of(task: object) -> Sequence[str] | None:
    """The labels of ``task`` (a run's ``data.task``) where it tags words and scores them by
    accuracy, else None: a per-tag accuracy is then the share of a tag's words tagged right."""
    found = tasks.TASKS.get(task) if isinstance(task, str) else None
    if found is None or found.head != "token" or found.primary_metric != "accuracy":
        return None
    return found.labels


def _counts(loaded: list, n: int) -> np.ndarray | None:
    """Seeds x gold x predicted counts of the runs' ``(gold, pred)`` ids over the task's ``n``
    labels; None where an id lies beyond them (a run of another label set)."""
    if any(max(g.max(initial=0), p.max(initial=0)) >= n for g, p in loaded):
        return None
    return np.stack([confusion_matrix(g, p, labels=np.arange(n)) for g, p in loaded])


def per_tag(
    summary: pd.DataFrame, used: pd.DataFrame, preds: Predictions, baseline: str
) -> PerTag | None:
    """Per-tag accuracy and confusions of each panel of ``summary`` whose task tags words
    (``labels_of``), from the predictions of its runs (``used``); None where no panel's does."""
    rows, confusion, lacking = [], {}, []
    for panel, strategies in summary.groupby("panel", sort=False).strategy:
        runs = used[used.panel == panel]
        labels = labels_of(runs.task.iloc[0])
        if labels is None:
            continue
        for split in SPLITS:
            for strategy in strategies:
                cell = runs[runs.freeze == strategy]
                loaded = [preds.ids(run_id, split) for run_id in cell.run_id]
                counts = None if None in loaded else _counts(loaded, len(labels))
                if counts is None:
                    why = "label ids beyond the task's labels" if None not in loaded else NONE
                    lacking.append((panel, split, strategy, why))
                    continue
                gold = counts.sum(axis=2, keepdims=True)
                # a tag without gold words has no accuracy: NaN, not 0
                nan = np.full(counts.shape, np.nan)
                shares = 100 * np.divide(counts, gold, out=nan, where=gold > 0)
                confusion[panel, strategy, split] = pd.DataFrame(
                    shares.mean(axis=0), index=list(labels), columns=list(labels)
                )
                accuracy = np.diagonal(shares, axis1=1, axis2=2)  # seeds x tags
                words = gold[:, :, 0].mean(axis=0)
                head = {"panel": panel, "data": cell.data.iloc[0], "model": cell.model.iloc[0]}
                rows += [
                    {
                        **head,
                        "strategy": strategy,
                        "split": split,
                        "tag": tag,
                        "words": words[i],
                        "n": len(cell),
                        "accuracy_pct": accuracy[:, i].mean(),
                        "accuracy_std_pct": accuracy[:, i].std(ddof=1)
                        if len(cell) > 1
                        else math.nan,
                    }
                    for i, tag in enumerate(labels)
                    if words[i] > 0
                ]
    if not rows and not lacking:
        return None
    table = pd.DataFrame(rows, columns=COLUMNS[:-1])
    if (table.words % 1 == 0).all():  # the seeds share their gold words, as they should
        table["words"] = table.words.astype(int)
    keys = ["panel", "split", "tag"]
    base = table.loc[table.strategy == baseline, [*keys, "accuracy_pct"]]
    table = table.merge(base.rename(columns={"accuracy_pct": "base"}), on=keys, how="left")
    table["delta_pt"] = table.accuracy_pct - table.pop("base")
    return PerTag(table, confusion, lacking)


def shown(report) -> list[tuple[str, str, list[str]]]:
    """What the confusion chart shows, per panel with confusions: its split (test where both
    strategies logged predictions there, else dev) and its baseline and best other strategy by
    dev score (the one or the other alone where the panel has no second)."""
    pt, out = report.per_tag, []
    if pt is None:
        return out
    for panel in report.summary.panel.unique():
        s = report.summary[report.summary.panel == panel]
        others = s[s.strategy != report.baseline].sort_values("dev_mean_pct", ascending=False)
        wanted = [x for x in (report.baseline, *others.strategy[:1]) if x in set(s.strategy)]
        for split in ("test", "dev"):
            have = [x for x in wanted if (panel, x, split) in pt.confusion]
            if have == wanted or (split == "dev" and have):
                out.append((panel, split, have))
                break
    return out


def markdown(report) -> list[str]:
    """``summary.md``'s per-tag section: a table per panel and split (a row per tag, a column
    per strategy: accuracy in %, mean over seeds) and one note on what has no numbers."""
    pt = report.per_tag
    if pt is None:
        return []
    lines = ["## Per-tag accuracy", ""]
    if pt.table.empty:
        return [*lines, inline(note(report)), ""]
    lines += [
        "Of the words of each gold tag, the share a strategy tagged right (%, mean over seeds; "
        "a classification report's recall), counted from each run's logged predictions "
        "(`predictions/<split>.json`); words: the tag's gold words in the split. per_tag.csv "
        f"holds each value's std over seeds and its difference from `{report.baseline}`.",
        "",
    ]
    for panel in report.summary.panel.unique():
        for split in SPLITS:
            t = pt.table[(pt.table.panel == panel) & (pt.table.split == split)]
            if t.empty:
                continue
            wide = t.pivot(index="tag", columns="strategy", values="accuracy_pct")
            wide = wide.reindex(index=t.tag.unique(), columns=t.strategy.unique())
            cells = wide.map(lambda x: "–" if math.isnan(x) else f"{x:.1f}")
            words = t.groupby("tag", sort=False).words.first().map(lambda w: f"{w:.0f}")
            cells.insert(0, "words", words)
            table = cells.reset_index(names="tag")
            right = [c for c in table.columns if c != "tag"]
            lines += [f"### {inline(heading(report, panel))} ({split})", ""]
            lines += [markdown_table(table, right=right), ""]
    if pt.lacking:
        lines += [inline(note(report)), ""]
    return lines


def note(report) -> str:
    """What has no per-tag numbers and why, in one line: by panel and split, the strategies
    (or every strategy) whose runs lack predictions there."""
    said = {}
    for panel, split, strategy, why in report.per_tag.lacking:
        said.setdefault((panel, split, why), []).append(strategy)
    every = report.summary.groupby("panel").strategy.nunique()
    parts = [
        f"{panel}, {split}: "
        + ("every strategy" if len(names) == every[panel] else ", ".join(names))
        + f" ({why})"
        for (panel, split, why), names in said.items()
    ]
    return "No per-tag numbers (none estimated) for " + "; ".join(parts) + "."
