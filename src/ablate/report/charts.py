"""The report's charts (seaborn): one figure per chart, one panel per dataset, baseline marked.

Each function takes an ``ablate.report.Report`` and returns a matplotlib Figure; nothing is
computed here that the summary does not already hold, so charts and tables cannot disagree.
The panels' layout, colours and titles are ``layout``'s.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, MaxNLocator

from ablate.report import layout, per_tag
from ablate.report.summary import Report
from ablate.report.timing import SPREAD, loaded, machines, savings_loaded, savings_spread, unloaded


def accuracy(report: Report):
    """Dev metric per strategy: mean over seeds, 95 % CI error bars, seeds as dots."""
    with layout.style():
        fig, axes = layout.figure(report)
        last = layout.legend_column(report)
        for col, ((ax,), panel) in enumerate(zip(axes, layout.panels(report), strict=True)):
            s = report.summary[report.summary.panel == panel].reset_index(drop=True)
            runs = report.runs[report.runs.panel == panel].assign(pct=lambda d: d.dev * 100)
            order, colours = list(s.strategy), layout.palette(s.strategy)
            for i, strategy in enumerate(order):  # seeds beside their bar, not on top of it
                ys = runs[runs.freeze == strategy].pct
                ax.scatter(
                    np.full(len(ys), i + 0.2),
                    ys,
                    s=14,
                    color="0.5",
                    zorder=2,
                    label="seeds" if i == 0 else None,
                )
            yerr = layout.yerr(s, "dev_mean_pct", "dev_ci_low_pct", "dev_ci_high_pct")
            for i, r in s.iterrows():
                base = r.strategy == report.baseline
                ax.errorbar(
                    i,
                    r.dev_mean_pct,
                    yerr=yerr[:, i : i + 1],
                    fmt="*" if base else "o",
                    ms=13 if base else 8,
                    color=colours[r.strategy],
                    capsize=5,
                    lw=2,
                    zorder=3,
                )
            layout.baseline_line(
                ax, layout.base_value(s, report, "dev_mean_pct"), f"{report.baseline} (baseline)"
            )
            if s.at_chance.fillna(False).astype(bool).any():  # shown where it tells something
                chance = s.chance_pct.iloc[0]
                ax.axhline(chance, color="0.35", ls=":", lw=1.5, zorder=1,
                           label=f"chance: the most frequent label ({chance:.1f} %)")  # fmt: skip
            layout.strategy_ticks(ax, order)
            ax.set_xlim(-0.5, len(order) - 0.5)
            ax.set(xlabel="freezing strategy", ylabel=layout.label(s.metric.iloc[0]))
            ax.set_title(layout.panel_title(report, panel))
            if col == last:
                layout.legend_beside(ax)
        methods = layout.methods(report.summary.dev_ci_method)
        layout.titles(
            fig,
            report,
            f"Dev {layout.metric(report)} per freezing strategy (mean over seeds)",
            f"error bars: 95 % CI ({methods})",
        )
    return fig


def convergence(report: Report):
    """Dev metric vs epoch: mean over seeds, band = min–max over seeds."""
    with layout.style():
        fig, axes = layout.figure(report)
        for (ax,), panel in zip(axes, layout.panels(report), strict=True):
            s = report.summary[report.summary.panel == panel]
            metric = s.metric.iloc[0]
            h = report.history
            h = h[(h.panel == panel) & (h.key == f"dev_{metric}")]
            h = h.assign(pct=h.value * 100)
            colours = layout.palette(s.strategy)
            for strategy, n in zip(s.strategy, s.n, strict=True):
                base = strategy == report.baseline
                sns.lineplot(
                    data=h[h.freeze == strategy],
                    x="epoch",
                    y="pct",
                    ax=ax,
                    errorbar=("pi", 100) if n > 1 else None,
                    color=colours[strategy],
                    label=f"{strategy} (baseline)" if base else strategy,
                    marker="o",
                    lw=2.6 if base else 1.6,
                    ls="--" if base else "-",
                    zorder=3 if base else 2,
                )
            epochs = int(h.epoch.max()) if len(h) else 1
            if epochs <= 12:
                ax.set_xticks(range(1, epochs + 1))
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlim(0.5 if epochs == 1 else 0.8, epochs + (0.5 if epochs == 1 else 0.2))
            ax.set(
                title=layout.panel_title(report, panel), xlabel="epoch", ylabel=layout.label(metric)
            )
            layout.legend_beside(ax)  # a panel's own: its strategies' curves
        one = (report.summary.n == 1).all()
        band = "one seed per strategy: no band" if one else "band: min–max over seeds"
        if int(report.history.epoch.max() if len(report.history) else 1) == 1:
            band = "one epoch: each strategy's dev score after it; " + band
        layout.titles(
            fig,
            report,
            f"Convergence: dev {layout.metric(report)} after each epoch (mean over seeds)",
            band,
        )
    return fig


def accuracy_vs_params(report: Report):
    """Dev metric vs trainable parameters, one labelled point per strategy."""
    with layout.style():
        fig, axes = layout.figure(report)
        for (ax,), panel in zip(axes, layout.panels(report), strict=True):
            s = report.summary[report.summary.panel == panel].reset_index(drop=True)
            colours = layout.palette(s.strategy)
            yerr = layout.yerr(s, "dev_mean_pct", "dev_ci_low_pct", "dev_ci_high_pct")
            for i, r in s.iterrows():
                base = r.strategy == report.baseline
                ax.errorbar(
                    r.trainable_params_m,
                    r.dev_mean_pct,
                    yerr=yerr[:, i : i + 1],
                    fmt="*" if base else "o",
                    ms=14 if base else 8,
                    color=colours[r.strategy],
                    capsize=4,
                    lw=1.5,
                    zorder=3,
                    alpha=0.85,
                    label=f"{r.strategy} (baseline)" if base else r.strategy,
                )
            layout.baseline_line(ax, layout.base_value(s, report, "dev_mean_pct"), "")
            # named in a legend beside the plot: strategies with close counts and scores would
            # bury labels written next to their points under each other
            # in columns of at most 11, so that a long list does not reach the tick labels below
            layout.legend_beside(ax, ncol=-(-len(s) // 11))
            spread = s.trainable_params_m.max() / max(s.trainable_params_m.min(), 1e-12)
            xlabel = "trainable parameters (M)"
            if spread > 20:  # LoRA-like strategies sit orders of magnitude below the others
                ax.set_xscale("log")
                xlabel += ", log scale"
            ax.margins(x=0.15, y=0.15)
            ax.set(xlabel=xlabel, ylabel=layout.label(s.metric.iloc[0]))
            ax.set_title(layout.panel_title(report, panel))
        methods = layout.methods(report.summary.dev_ci_method)
        layout.titles(
            fig,
            report,
            f"Dev {layout.metric(report)} vs trainable parameters (mean over seeds)",
            f"error bars: 95 % CI ({methods}); dashed line: baseline",
        )
    return fig


def train_time(report: Report):
    """Training time per strategy (seeds as dots) and the savings in time and params vs baseline."""
    with layout.style():
        fig, axes = layout.figure(report, rows=2)
        b, marked, unsure = report.baseline, False, False
        last = layout.legend_column(report)
        for col, ((top, bottom), panel) in enumerate(zip(axes, layout.panels(report), strict=True)):
            s = report.summary[report.summary.panel == panel].reset_index(drop=True)
            # the runs whose times the bars average (loaded ones left out where there are others)
            runs = report.runs[report.runs.panel == panel]
            runs = pd.concat([unloaded(cell) for _, cell in runs.groupby("freeze")])
            order, colours = list(s.strategy), layout.palette(s.strategy)
            sns.barplot(
                data=s,
                x="strategy",
                y="train_time_s",
                order=order,
                hue="strategy",
                palette=colours,
                legend=False,
                ax=top,
                errorbar=None,
                alpha=0.85,
                width=0.6,
            )
            for bar, strategy in zip(top.patches, order, strict=False):
                if strategy == b:
                    bar.set_hatch("//")
                    bar.set_edgecolor("white")
            # seaborn jitters the dots with NumPy's global generator: seeded here (and put back)
            # so a report draws the same chart, byte for byte, each time it is made
            state = np.random.get_state()
            np.random.seed(0)
            try:
                sns.stripplot(
                    data=runs,
                    x="freeze",
                    y="train_time_s",
                    order=order,
                    color="0.3",
                    size=4,
                    jitter=0.12,
                    edgecolor="white",  # seen on the baseline's dark bar too
                    linewidth=0.8,
                    ax=top,
                )
            finally:
                np.random.set_state(state)
            busy, saving_busy = loaded(s), savings_loaded(s)  # as the table marks them
            spread = savings_spread(s) > SPREAD  # as the findings call them uncertain
            for i, r in s.iterrows():
                label = (
                    ""
                    if r.strategy == b or math.isnan(r.time_savings_pct)
                    else (f"{-r.time_savings_pct:+.0f} %")
                )
                mark = " *" if busy[i] or (label and saving_busy[i]) else ""
                mark += " ?" if label and spread[i] else ""
                unsure = unsure or bool(label and spread[i])
                if label or mark:
                    y = max(r.train_time_s, runs[runs.freeze == r.strategy].train_time_s.max())
                    top.annotate(
                        (label + mark).strip(),
                        (i, y),
                        xytext=(0, 3),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        # readable where it sits on the baseline's line
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"},
                    )
            marked = marked or bool(busy.any() or saving_busy.any())
            layout.baseline_line(
                top, layout.base_value(s, report, "train_time_s"), f"{b} (baseline)"
            )
            top.set(xlabel="", ylabel="train time (s), no dev evaluation")
            title = layout.panel_title(report, panel)
            if machines(runs).nunique() > 1:  # as the report's notes say
                title += "\ntimes from several machines (the report's notes say which)"
            top.set_title(title)
            top.margins(y=0.12)  # room for the labels above the bars
            if top.get_legend_handles_labels()[0] and col == last:
                layout.legend_beside(top)

            saved = s[s.strategy != b].melt(
                id_vars="strategy",
                value_vars=["time_savings_pct", "param_savings_pct"],
                var_name="saving",
                value_name="pct",
            )
            saved["saving"] = saved.saving.map(
                {"time_savings_pct": "train time", "param_savings_pct": "trainable params"}
            )
            if saved.pct.notna().any():
                sns.barplot(
                    data=saved,
                    x="strategy",
                    y="pct",
                    hue="saving",
                    order=order[1:] if order[0] == b else order,
                    palette=["#4c72b0", "#dd8452"],
                    ax=bottom,
                    errorbar=None,
                    width=0.6,
                )
                # legends beside the last panel: inside, they cover the baseline's bar or one
                # that saves ~100 % of the params
                if col == last:
                    layout.legend_beside(bottom, title=None)
                else:
                    bottom.get_legend().remove()
            else:
                bottom.text(
                    0.5, 0.5, f"no {b} run: no savings", ha="center", transform=bottom.transAxes
                )
            bottom.axhline(0, color=layout.BASELINE_COLOR, lw=1)
            bottom.set(xlabel="freezing strategy", ylabel=f"saving vs {b} (%)")
            layout.strategy_ticks(top, order)
            layout.strategy_ticks(bottom, [t.get_text() for t in bottom.get_xticklabels()])
        said = "; *: timed only on a loaded machine, compare with care" if marked else ""
        if unsure:
            said += f"; ?: its or {b}'s times over {SPREAD:g}x apart or of unknown CPU speed"
        layout.titles(
            fig,
            report,
            "Training time per strategy and savings vs the baseline",
            "time spent training (dev evaluation excluded); bars: mean over seeds, "
            f"dots: seeds; labels: change vs {b}{said}",
        )
    return fig


def _heatmap(ax, frame: pd.DataFrame, words: pd.Series, ticks, signed=False, **kwargs) -> None:
    """One confusion heatmap: whole percents (``+``/``-`` on a difference), cells under half a
    point left blank (most: a tag seldom taken for another), each gold tag named with its words;
    its colour bar's ``ticks``."""
    small = frame.isna() | (frame.abs() < 0.5)
    form = FuncFormatter(lambda x, _=None: f"{x:+.0f}" if signed and abs(x) >= 0.5 else f"{x:.0f}")
    text = frame.map(form).where(~small, "")
    sns.heatmap(frame, ax=ax, annot=text.to_numpy(), fmt="", mask=small, square=True,
                linewidths=0.4, linecolor="0.92", xticklabels=True, annot_kws={"fontsize": 7.5},
                yticklabels=[f"{t} ({words.get(t, 0):,.0f})" for t in frame.index],
                cbar_kws={"shrink": 0.7, "ticks": ticks, "format": form}, **kwargs)  # fmt: skip
    ax.grid(False)  # the style's grid would cross the cells
    ax.set(xlabel="predicted tag", ylabel="gold tag (its words)")
    ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(axis="y", labelrotation=0)


def confusion(report: Report):
    """Confusions of each panel whose task tags words (``per_tag.shown``): the baseline's and
    the best other strategy's (by dev score), each row a gold tag's words split by the tag
    predicted (%, mean over seeds), and their difference (pt)."""
    from matplotlib.colors import PowerNorm, SymLogNorm

    shown = per_tag.shown(report)
    cols = max(len(names) + (len(names) == 2) for _, _, names in shown)
    table = report.per_tag.table
    with layout.style():
        fig, axes = plt.subplots(
            len(shown), cols, figsize=(6.3 * cols, 6.2 * len(shown)), squeeze=False,
            layout="constrained",
        )  # fmt: skip
        for row, (panel, split, names) in zip(axes, shown, strict=True):
            frames = [report.per_tag.confusion[panel, name, split] for name in names]
            here = table[(table.panel == panel) & (table.split == split)]
            words = here.groupby("tag").words.first()
            name = layout.panel_title(report, panel)
            for i, (ax, strategy, frame) in enumerate(zip(row, names, frames, strict=False)):
                role = " (baseline)" if strategy == report.baseline else ""
                # a power scale: the few percent a tag is taken for another show beside the
                # ~95 % of its diagonal; one colour bar for both
                norm = PowerNorm(0.5, vmin=0, vmax=100)
                last = i == len(frames) - 1
                ticks = [0, 5, 20, 50, 100]
                _heatmap(ax, frame, words, ticks, cmap="rocket_r", norm=norm, cbar=last)
                ax.set_title(f"{name}\n{strategy}{role}: % of each gold tag's {split} words")
            if len(frames) == 2:
                diff = frames[1] - frames[0]
                lim = max(float(np.nanmax(np.abs(diff.to_numpy()))), 1.0)
                # linear within a point, logarithmic beyond: a rare tag's -30 does not wash out
                # the common tags' few points
                norm = SymLogNorm(linthresh=1, vmin=-lim, vmax=lim)
                ticks = sorted(
                    {0, *(s * t for t in (1, 10, int(lim)) if t <= lim for s in (1, -1))}
                )
                _heatmap(row[2], diff, words, ticks, signed=True, cmap="vlag", norm=norm)
                row[2].set_title(f"{name}\n{names[1]} − {names[0]} (pt)")
            for ax in row[len(frames) + (len(frames) == 2) :]:
                fig.delaxes(ax)
        layout.titles(
            fig,
            report,
            f"Confusions: the baseline and the best other strategy by dev {layout.metric(report)}",
            "each row: a gold tag's words by the tag predicted (%, mean over seeds; blank: under "
            "0.5); right: the difference (red: predicted more often)",
        )
    return fig
