"""The report's charts (seaborn): one figure per chart, one panel per dataset, baseline marked.

Each function takes an ``ablate.report.Report`` and returns a matplotlib Figure; nothing is
computed here that the summary does not already hold, so charts and tables cannot disagree.
"""

from __future__ import annotations

import math
import textwrap
from contextlib import contextmanager

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from ablate.report.cell import LOADED, unloaded
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
def _style():
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.95):
        yield


def _panels(report: Report) -> list[str]:
    return list(report.summary.panel.unique())


def _columns(report: Report) -> tuple[int, float]:
    """Panels per row of a figure and the width of each (inches)."""
    n = len(_panels(report))
    most = report.summary.groupby("panel").strategy.nunique().max()
    width = max(PANEL_W, STRATEGY_W * most + 1.6)
    return max(1, min(n, int(PAGE_W // width))), width


def _figure(report: Report, rows: int = 1):
    """A figure of one panel per dataset (and model, and group of settings), wrapped into rows
    of at most ``PAGE_W``; each panel ``rows`` axes high. Returns the figure and, per panel,
    its axes from top to bottom."""
    n = len(_panels(report))
    cols, width = _columns(report)
    lines = -(-n // cols)
    fig, axes = plt.subplots(
        rows * lines, cols, figsize=(width * cols, PANEL_H * rows * lines), squeeze=False,
        layout="constrained",
    )  # fmt: skip
    cells = [
        [axes[i // cols * rows + r, i % cols] for r in range(rows)] for i in range(lines * cols)
    ]
    for unused in cells[n:]:  # the last row's empty places
        for ax in unused:
            fig.delaxes(ax)
    return fig, cells[:n]


def _strategy_ticks(ax, order) -> None:
    """Strategy names under their bars, slanted and anchored at their end so none overlaps."""
    ax.set_xticks(range(len(order)), order)
    for label in ax.get_xticklabels():
        label.set(rotation=40, ha="right", rotation_mode="anchor")


def _label(metric: str) -> str:
    return f"dev {metric} (%)"


def _metric(report: Report) -> str:
    metrics = report.summary.metric.unique()
    return metrics[0] if len(metrics) == 1 else "score"


def _settings(report: Report) -> dict[str, str]:
    """Each panel's settings in words (what differs from the defaults)."""
    return dict(zip(report.summary.panel, report.summary.settings, strict=True))


def _panel_title(report: Report, panel: str) -> str:
    """A panel's title, with its settings under it where the panels' settings differ (else the
    figure's subtitle names them once)."""
    if len(set(_settings(report).values())) < 2:
        return panel
    name, settings = named(report, panel)
    return f"{name}\n{textwrap.fill(settings, 60)}"


def _titles(fig, report: Report, title: str, subtitle: str) -> None:
    """The figure's title and subtitle, the subtitle ending with the runs' settings, so that a
    chart shared alone says which recipe it shows."""
    settings = set(_settings(report).values())
    if len(settings) > 1:
        line = "Settings: under each panel's name"
    elif settings != {DEFAULTS}:
        line = f"Settings beyond the defaults: {settings.pop()}"
    else:
        line = "Default settings"
    width = int(70 * _columns(report)[0])  # a long subtitle would widen a one-panel figure
    lines = [title, textwrap.fill(subtitle, width), textwrap.fill(line, width)]
    fig.suptitle("\n".join(lines), fontsize=12)
    src = report.source
    fig.text(
        0.0, -0.02,
        f"Source: MLflow experiment '{src.get('experiment')}', {len(report.runs)} runs; "
        f"baseline = {report.baseline}.",
        fontsize=8, color="0.35", ha="left", va="top",
    )  # fmt: skip


def _baseline_line(ax, y: float, text: str) -> None:
    """The baseline's value as a dashed line, named in the legend (a label on the line would
    collide with the strategies' own)."""
    if y is None or math.isnan(y):
        return
    ax.axhline(y, ls="--", lw=1.2, color=BASELINE_COLOR, alpha=0.7, zorder=0, label=text or None)


def _base_value(s: pd.DataFrame, report: Report, col: str) -> float:
    row = s[s.strategy == report.baseline]
    return float(row[col].iloc[0]) if len(row) else math.nan


def _yerr(s: pd.DataFrame, mean: str, lo: str, hi: str) -> np.ndarray:
    return np.vstack([s[mean] - s[lo], s[hi] - s[mean]]).clip(min=0)


def _methods(values) -> str:
    kinds = sorted({v for v in values if v})
    return "; ".join(kinds) if kinds else "none"


def accuracy(report: Report):
    """Dev metric per strategy: mean over seeds, 95 % CI error bars, seeds as dots."""
    with _style():
        fig, axes = _figure(report)
        for (ax,), panel in zip(axes, _panels(report), strict=True):
            s = report.summary[report.summary.panel == panel].reset_index(drop=True)
            runs = report.runs[report.runs.panel == panel].assign(pct=lambda d: d.dev * 100)
            order, colours = list(s.strategy), palette(s.strategy)
            for i, strategy in enumerate(order):  # seeds beside their bar, not on top of it
                ys = runs[runs.freeze == strategy].pct
                ax.scatter(np.full(len(ys), i + 0.2), ys, s=14, color="0.5", zorder=2,
                           label="seeds" if i == 0 else None)  # fmt: skip
            yerr = _yerr(s, "dev_mean_pct", "dev_ci_low_pct", "dev_ci_high_pct")
            for i, r in s.iterrows():
                base = r.strategy == report.baseline
                ax.errorbar(
                    i, r.dev_mean_pct, yerr=yerr[:, i : i + 1], fmt="*" if base else "o",
                    ms=13 if base else 8, color=colours[r.strategy],
                    capsize=5, lw=2, zorder=3,
                )  # fmt: skip
            _baseline_line(
                ax, _base_value(s, report, "dev_mean_pct"), f"{report.baseline} (baseline)"
            )
            _strategy_ticks(ax, order)
            ax.set_xlim(-0.5, len(order) - 0.5)
            ax.set(xlabel="freezing strategy", ylabel=_label(s.metric.iloc[0]))
            ax.set_title(_panel_title(report, panel))
            ax.legend(loc="lower left", fontsize=8)
        methods = _methods(report.summary.dev_ci_method)
        _titles(fig, report, f"Dev {_metric(report)} per freezing strategy (mean over seeds)",
                f"error bars: 95 % CI ({methods})")  # fmt: skip
    return fig


def convergence(report: Report):
    """Dev metric vs epoch: mean over seeds, band = min–max over seeds."""
    with _style():
        fig, axes = _figure(report)
        for (ax,), panel in zip(axes, _panels(report), strict=True):
            s = report.summary[report.summary.panel == panel]
            metric = s.metric.iloc[0]
            h = report.history
            h = h[(h.panel == panel) & (h.key == f"dev_{metric}")]
            h = h.assign(pct=h.value * 100)
            colours = palette(s.strategy)
            for strategy, n in zip(s.strategy, s.n, strict=True):
                base = strategy == report.baseline
                sns.lineplot(
                    data=h[h.freeze == strategy], x="epoch", y="pct", ax=ax,
                    errorbar=("pi", 100) if n > 1 else None, color=colours[strategy],
                    label=f"{strategy} (baseline)" if base else strategy, marker="o",
                    lw=2.6 if base else 1.6, ls="--" if base else "-", zorder=3 if base else 2,
                )  # fmt: skip
            epochs = int(h.epoch.max()) if len(h) else 1
            if epochs <= 12:
                ax.set_xticks(range(1, epochs + 1))
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlim(0.5 if epochs == 1 else 0.8, epochs + (0.5 if epochs == 1 else 0.2))
            ax.set(title=_panel_title(report, panel), xlabel="epoch", ylabel=_label(metric))
            # beside the plot: a dozen strategies would cover their own curves
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
        one = (report.summary.n == 1).all()
        band = "one seed per strategy: no band" if one else "band: min–max over seeds"
        if int(report.history.epoch.max() if len(report.history) else 1) == 1:
            band = "one epoch: each strategy's dev score after it; " + band
        _titles(
            fig,
            report,
            f"Convergence: dev {_metric(report)} after each epoch (mean over seeds)",
            band,
        )
    return fig


def accuracy_vs_params(report: Report):
    """Dev metric vs trainable parameters, one labelled point per strategy."""
    with _style():
        fig, axes = _figure(report)
        for (ax,), panel in zip(axes, _panels(report), strict=True):
            s = report.summary[report.summary.panel == panel].reset_index(drop=True)
            colours = palette(s.strategy)
            yerr = _yerr(s, "dev_mean_pct", "dev_ci_low_pct", "dev_ci_high_pct")
            for i, r in s.iterrows():
                base = r.strategy == report.baseline
                ax.errorbar(
                    r.trainable_params_m, r.dev_mean_pct, yerr=yerr[:, i : i + 1],
                    fmt="*" if base else "o", ms=14 if base else 8, color=colours[r.strategy],
                    capsize=4, lw=1.5, zorder=3, alpha=0.85,
                    label=f"{r.strategy} (baseline)" if base else r.strategy,
                )  # fmt: skip
            _baseline_line(ax, _base_value(s, report, "dev_mean_pct"), "")
            # named in a legend beside the plot: strategies with close counts and scores would
            # bury labels written next to their points under each other
            # in columns of at most 11, so that a long list does not reach the tick labels below
            ax.legend(
                fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0,
                ncol=-(-len(s) // 11),
            )  # fmt: skip
            spread = s.trainable_params_m.max() / max(s.trainable_params_m.min(), 1e-12)
            xlabel = "trainable parameters (M)"
            if spread > 20:  # LoRA-like strategies sit orders of magnitude below the others
                ax.set_xscale("log")
                xlabel += ", log scale"
            ax.margins(x=0.15, y=0.15)
            ax.set(xlabel=xlabel, ylabel=_label(s.metric.iloc[0]))
            ax.set_title(_panel_title(report, panel))
        methods = _methods(report.summary.dev_ci_method)
        _titles(fig, report, f"Dev {_metric(report)} vs trainable parameters (mean over seeds)",
                f"error bars: 95 % CI ({methods}); dashed line: baseline")  # fmt: skip
    return fig


def train_time(report: Report):
    """Training time per strategy (seeds as dots) and the savings in time and params vs baseline."""
    with _style():
        fig, axes = _figure(report, rows=2)
        b, marked = report.baseline, False
        last = _columns(report)[0] - 1  # legends beside the first row's last panel: the right edge
        for col, ((top, bottom), panel) in enumerate(zip(axes, _panels(report), strict=True)):
            s = report.summary[report.summary.panel == panel].reset_index(drop=True)
            # the runs whose times the bars average (loaded ones left out where there are others)
            runs = report.runs[report.runs.panel == panel]
            runs = pd.concat([unloaded(cell) for _, cell in runs.groupby("freeze")])
            order, colours = list(s.strategy), palette(s.strategy)
            sns.barplot(
                data=s, x="strategy", y="train_time_s", order=order, hue="strategy",
                palette=colours, legend=False, ax=top, errorbar=None, alpha=0.85, width=0.6,
            )  # fmt: skip
            for bar, strategy in zip(top.patches, order, strict=False):
                if strategy == b:
                    bar.set_hatch("//")
                    bar.set_edgecolor("white")
            sns.stripplot(
                data=runs, x="freeze", y="train_time_s", order=order, color="0.3", size=4,
                jitter=0.12, ax=top,
            )  # fmt: skip
            for i, r in s.iterrows():
                mark = " *" if r.load_per_cpu > LOADED else ""  # as the table marks it
                label = "" if r.strategy == b or math.isnan(r.time_savings_pct) else (
                    f"{-r.time_savings_pct:+.0f} %"
                )  # fmt: skip
                if label or mark:
                    y = max(r.train_time_s, runs[runs.freeze == r.strategy].train_time_s.max())
                    top.annotate(
                        (label + mark).strip(), (i, y), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7,
                    )  # fmt: skip
            marked = marked or bool((s.load_per_cpu > LOADED).any())
            _baseline_line(top, _base_value(s, report, "train_time_s"), f"{b} (baseline)")
            top.set(xlabel="", ylabel="train time (s), no dev evaluation")
            top.set_title(_panel_title(report, panel))
            top.margins(y=0.12)  # room for the labels above the bars
            if top.get_legend_handles_labels()[0] and col == last:
                top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)

            saved = s[s.strategy != b].melt(
                id_vars="strategy", value_vars=["time_savings_pct", "param_savings_pct"],
                var_name="saving", value_name="pct",
            )  # fmt: skip
            saved["saving"] = saved.saving.map(
                {"time_savings_pct": "train time", "param_savings_pct": "trainable params"}
            )
            if saved.pct.notna().any():
                sns.barplot(
                    data=saved, x="strategy", y="pct", hue="saving", order=order[1:] if
                    order[0] == b else order, palette=["#4c72b0", "#dd8452"], ax=bottom,
                    errorbar=None, width=0.6,
                )  # fmt: skip
                # legends beside the last panel: inside, they cover the baseline's bar or one
                # that saves ~100 % of the params
                if col == last:
                    bottom.legend(fontsize=8, title=None, loc="upper left",
                                  bbox_to_anchor=(1.01, 1), borderaxespad=0)  # fmt: skip
                else:
                    bottom.get_legend().remove()
            else:
                bottom.text(0.5, 0.5, f"no {b} run: no savings", ha="center",
                            transform=bottom.transAxes)  # fmt: skip
            bottom.axhline(0, color=BASELINE_COLOR, lw=1)
            bottom.set(xlabel="freezing strategy", ylabel=f"saving vs {b} (%)")
            _strategy_ticks(top, order)
            _strategy_ticks(bottom, [t.get_text() for t in bottom.get_xticklabels()])
        loaded = "; *: timed only on a loaded machine, compare with care" if marked else ""
        _titles(fig, report, "Training time per strategy and savings vs the baseline",
                "time spent training (dev evaluation excluded); bars: mean over seeds, "
                f"dots: seeds; labels: change vs {b}{loaded}")  # fmt: skip
    return fig
