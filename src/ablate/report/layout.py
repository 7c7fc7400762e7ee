"""The charts' shared layout: one panel per dataset wrapped at a page's width, a fixed colour
per strategy, the baseline's line and the titles that say which runs and settings a chart shows.
"""

from __future__ import annotations

import math
import textwrap
from contextlib import contextmanager

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ablate.report.recipe import DEFAULTS, named
from ablate.report.summary import STRATEGY_ORDER, Report

BASELINE_COLOR = "#222222"
PANEL_W, PANEL_H = 5.6, 4.2
STRATEGY_W = 0.62  # inches of panel width per strategy, so that their labels never overlap
# A row of panels wider than this wraps onto the next (about 2,200 px at the report's 120 dpi):
# a report of many datasets stays readable at a page's width.
PAGE_W = 18.0


def palette(strategies) -> dict[str, str]:
    """A fixed colour per strategy (same in every chart and report); the baseline is black."""
    # tab10 without its grey (the colour of seed dots), plus tab20b's darks and mids for the rest.
    base = [c for i, c in enumerate(sns.color_palette("tab10").as_hex()) if i != 7]
    base += ["#393b79", "#637939", "#8c6d31", "#7b4173", "#843c39", "#5254a3", "#8ca252"]
    base += ["#bd9e39", "#ad494a", "#a55194", "#6b6ecf"]
    # the strategies' options in their order, then any others: husl beyond the base colours
    named = [*STRATEGY_ORDER[1:], *sorted(set(strategies) - set(STRATEGY_ORDER))]
    n_more = len(named) - len(base)
    more = sns.color_palette("husl", n_more).as_hex() if n_more > 0 else []
    colours = dict(zip(named, base + more, strict=False))
    colours[STRATEGY_ORDER[0]] = BASELINE_COLOR
    return {s: colours.get(s, BASELINE_COLOR) for s in strategies}


@contextmanager
def style():
    """The charts' seaborn style, the same in every figure."""
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.95):
        yield


def panels(report: Report) -> list[str]:
    """The report's panels (dataset, model, settings) in its order."""
    return list(report.summary.panel.unique())


def columns(report: Report) -> tuple[int, float]:
    """Panels per row of a figure and the width of each (inches)."""
    n = len(panels(report))
    most = report.summary.groupby("panel").strategy.nunique().max()
    width = max(PANEL_W, STRATEGY_W * most + 1.6)
    return max(1, min(n, int(PAGE_W // width))), width


def figure(report: Report, rows: int = 1):
    """A figure of one panel per dataset (and model, and group of settings), wrapped into rows
    of at most ``PAGE_W``; each panel ``rows`` axes high. Returns the figure and, per panel,
    its axes from top to bottom."""
    n = len(panels(report))
    cols, width = columns(report)
    lines = -(-n // cols)
    fig, axes = plt.subplots(
        rows * lines,
        cols,
        figsize=(width * cols, PANEL_H * rows * lines),
        squeeze=False,
        layout="constrained",
    )
    cells = [
        [axes[i // cols * rows + r, i % cols] for r in range(rows)] for i in range(lines * cols)
    ]
    for unused in cells[n:]:  # the last row's empty places
        for ax in unused:
            fig.delaxes(ax)
    return fig, cells[:n]


def legend_column(report: Report) -> int:
    """The column of the first row's panel that carries a figure's one legend: the last, whose
    right edge has room for it."""
    return columns(report)[0] - 1


def legend_beside(ax, **kwargs):
    """The axes' legend beside them, top right: inside, a legend covers a bar or a mark wherever
    the data happen to lie."""
    return ax.legend(
        fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, **kwargs
    )


def strategy_ticks(ax, order) -> None:
    """Strategy names under their bars, slanted and anchored at their end so none overlaps."""
    ax.set_xticks(range(len(order)), order)
    for label in ax.get_xticklabels():
        label.set(rotation=40, ha="right", rotation_mode="anchor")


def label(metric: str) -> str:
    """A y axis's label for a dev metric."""
    return f"dev {metric} (%)"


def metric(report: Report) -> str:
    """The metric's name for a title: the one metric, or "score" where panels differ."""
    metrics = report.summary.metric.unique()
    return metrics[0] if len(metrics) == 1 else "score"


def panel_settings(report: Report) -> dict[str, str]:
    """Each panel's settings in words (what differs from the defaults)."""
    return dict(zip(report.summary.panel, report.summary.settings, strict=True))


def panel_title(report: Report, panel: str) -> str:
    """A panel's title, with its settings under it where the panels' settings differ (else the
    figure's subtitle names them once)."""
    if len(set(panel_settings(report).values())) < 2:
        return panel
    name, settings = named(report, panel)
    return f"{name}\n{textwrap.fill(settings, 60)}"


def titles(fig, report: Report, title: str, subtitle: str) -> None:
    """The figure's title and subtitle, the subtitle ending with the runs' settings, so that a
    chart shared alone says which recipe it shows."""
    settings = set(panel_settings(report).values())
    if len(settings) > 1:
        line = "Settings: under each panel's name"
    elif settings != {DEFAULTS}:
        line = f"Settings beyond the defaults: {settings.pop()}"
    else:
        line = "Default settings"
    width = int(70 * columns(report)[0])  # a long subtitle would widen a one-panel figure
    lines = [title, textwrap.fill(subtitle, width), textwrap.fill(line, width)]
    fig.suptitle("\n".join(lines), fontsize=12)
    src = report.source
    fig.text(
        0.0,
        -0.02,
        f"Source: MLflow experiment '{src.get('experiment')}', {report.runs.run_id.nunique()} "
        "runs; "
        + (
            f"baseline = {report.baseline}."
            if (report.runs.freeze == report.baseline).any()
            else f"no {report.baseline} run, so no baseline."
        ),
        fontsize=8,
        color="0.35",
        ha="left",
        va="top",
    )


def baseline_line(ax, y: float, text: str) -> None:
    """The baseline's value as a dashed line, named in the legend (a label on the line would
    collide with the strategies' own)."""
    if y is None or math.isnan(y):
        return
    ax.axhline(y, ls="--", lw=1.2, color=BASELINE_COLOR, alpha=0.7, zorder=0, label=text or None)


def base_value(s: pd.DataFrame, report: Report, col: str) -> float:
    """The baseline's value of ``col`` in a panel's summary (nan without a baseline run)."""
    row = s[s.strategy == report.baseline]
    return float(row[col].iloc[0]) if len(row) else math.nan


def yerr(s: pd.DataFrame, mean: str, lo: str, hi: str) -> np.ndarray:
    """Error bars (below, above the mean) from an interval's columns."""
    return np.vstack([s[mean] - s[lo], s[hi] - s[mean]]).clip(min=0)


def methods(values) -> str:
    """The interval methods used, in words."""
    kinds = sorted({v for v in values if v})
    return "; ".join(kinds) if kinds else "none"
