"""The report as people read it: ``summary.md`` (a table per dataset, how intervals were made,
the runs left out), ``summary.csv``, ``runs.csv`` and one PNG per chart (``write``)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ablate.config import project_root
from ablate.report import per_tag
from ablate.report.cell import LR_FROM_STUDY
from ablate.report.delta import BASELINE_METHOD, COLUMNS
from ablate.report.recipe import heading
from ablate.report.stats import N_BOOT
from ablate.report.summary import Report
from ablate.report.timing import loaded, savings_loaded
from ablate.tables import inline, markdown_table

CHARTS = ("accuracy", "convergence", "accuracy_vs_params", "train_time")
# drawn where a panel's task tags words and its runs logged their predictions
CONFUSION = "confusion"
# runs.csv: each run behind the summary, where it came from (its commit) and what it measured.
RUN_COLUMNS = [
    "panel",
    "run_id",
    "run_name",
    "data",
    "model",
    "freeze",
    "seed",
    "lr",
    "tuned",
    "dev",
    "test",
    "train_time_s",
    "wall_s",
    "load_per_cpu",
    "start_time",
    "git_commit",
]


def _num(x: float, digits: int = 2, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def millions(m: float) -> str:
    """Parameters in millions, three significant digits at least."""
    return f"{m:.1f}" if m >= 100 else f"{m:.2f}" if m >= 1 else f"{m:.3g}"


def share(pct: float, digits: int = 1) -> str:
    """A saving in percent to ``digits`` decimals, or more where that would round a partial
    saving to 0 or 100 (a head-only run saves 99.97 % of the params, not all of them)."""
    if pct is None or math.isnan(pct):
        return "–"
    text = f"{pct:.{digits}f}"
    while float(text) in (0, 100) and pct not in (0, 100) and digits < 6:
        digits += 1
        text = f"{pct:.{digits}f}"
    return text


def p_value(p: float) -> str:
    """A p-value as a table shows it: three decimals, or one significant digit below 0.001."""
    if p is None or math.isnan(p):
        return "–"
    return f"{p:.0e}" if p < 0.001 else f"{p:.3f}"


def _delta(r, split: str) -> str:
    """A summary row's difference from the baseline on ``split``, with its interval."""
    pt, low, high, method, _ = (getattr(r, c) for c in COLUMNS[split])
    if method == BASELINE_METHOD:
        return "baseline"
    said = _num(pt, sign=True)
    if not math.isnan(low):
        said += f" [{_num(low, sign=True)}, {_num(high, sign=True)}]"
    return said


def _mcnemar(r) -> str:
    """McNemar's Holm-adjusted p and how many of the paired seeds it rests on."""
    if r.delta_method == BASELINE_METHOD:
        return ""
    tested = r.mcnemar_tested if isinstance(r.mcnemar_tested, str) else ""
    return p_value(r.mcnemar_p_holm) + (f" ({tested})" if tested else "")


def _lr(lr: float, source: str, interior: object) -> str:
    """The lr shown for a strategy: where its study picked it, and whether that pick lay at the
    edge of the range the study searched (``lr_interior`` False)."""
    if lr is None or math.isnan(lr):
        return "–"
    if source != LR_FROM_STUDY:
        return f"{lr:.2g}"
    return f"{lr:.2g} (its study's" + (", **at its range's edge**)" if interior is False else ")")


def table(report: Report, panel: str | None = None) -> pd.DataFrame:
    """The summary as display strings (what ``summary.md`` shows), for one panel or all."""
    s = report.summary if panel is None else report.summary[report.summary.panel == panel]
    b = report.baseline
    out = []
    marks = loaded(s).map({True: " *", False: ""})
    saving_marks = savings_loaded(s).map({True: " *", False: ""})
    for r, mark, saving_mark in zip(s.itertuples(), marks, saving_marks, strict=True):
        baseline = r.delta_method == BASELINE_METHOD
        dev = _num(r.dev_mean_pct)
        dev += f" ± {_num(r.dev_std_pct)}" if r.n > 1 else " (1 seed)"
        out.append(
            {
                "dataset": r.panel,
                "strategy": r.strategy,
                "lr": _lr(r.lr, r.lr_from, r.lr_interior),
                f"dev {r.metric} (%)": dev,
                "n": r.n,
                f"test {r.metric} (%)": _num(r.test_mean_pct)
                + (f" ± {_num(r.test_std_pct)}" if r.n > 1 else ""),
                "trainable params (M)": millions(r.trainable_params_m),
                f"param savings vs {b} (%)": share(r.param_savings_pct),
                "train time (s)": _num(r.train_time_s, 1) + mark,
                f"time savings vs {b} (%)": share(r.time_savings_pct) + saving_mark,
                "train FLOPs": "–" if math.isnan(r.train_flops) else f"{r.train_flops:.3g}",
                "wall time (s)": _num(r.wall_s, 0) + mark,
                "peak memory (MiB)": _num(r.peak_rss_mb, 0) + (" †" if r.peak_rss_carried else ""),
                f"Δ dev vs {b} (pt) [95 % CI]": _delta(r, "dev"),
                f"Δ test vs {b} (pt) [95 % CI]": _delta(r, "test"),
                "Holm p, Δ dev": "" if baseline else p_value(r.delta_dev_p_holm),
                "Holm p, Δ test": "" if baseline else p_value(r.delta_test_p_holm),
                "McNemar on test, Holm p (seeds)": _mcnemar(r),
                "interval": _intervals(r),
            }
        )
    return pd.DataFrame(out)


def _intervals(r) -> str:
    """How the intervals on dev and test were made: one method where both share it."""
    if r.delta_method == BASELINE_METHOD:
        return ""
    if r.delta_test_method == r.delta_method:
        return r.delta_method
    return f"dev: {r.delta_method}; test: {r.delta_test_method}"


LOADED_MARK = (
    "*: timed only on a loaded machine (more runnable threads than CPUs, other work busy as it "
    "started, or a GPU shared with other jobs), or a saving against such a time: compare with "
    "care."
)


CARRIED_MARK = (
    "†: a peak that may include earlier jobs': a sweep's later job that ran in the process of "
    "earlier ones and was recorded without resetting the process's peak as it started (runs "
    "recorded before ablate did): at most that high."
)


# Each mark a cell can end with, and the line that says what it means.
MARKS = ((" *", LOADED_MARK), (" †", CARRIED_MARK))


def _legend(t: pd.DataFrame) -> list[str]:
    """The lines that say what each mark in a cell of ``t`` means, for the marks it carries."""
    cells = [t[c].astype(str) for c in t.columns]
    return [inline(line) for end, line in MARKS if any(c.str.endswith(end).any() for c in cells)]


# The columns of a short summary (a sweep's description in MLflow's narrow box), by the start
# of their names: the metric's and the baseline's names are in them.
SHORT = ("strategy", "dev ", "test ", "trainable params", "train time", "Δ dev", "Δ test")


def tables(report: Report, short: bool = False) -> str:
    """The summary tables alone, one per panel (dataset, model, group of settings), each under
    its heading; ``short``: only the columns ``SHORT`` names."""
    parts = []
    for panel in report.summary.panel.unique():
        t = table(report, panel).drop(columns=["dataset", "interval"])
        if short:
            t = t[[c for c in t.columns if c.startswith(SHORT)]]
        numeric = [c for c in t.columns if c not in ("strategy", "lr")]
        table_ = markdown_table(t, right=numeric)
        parts += [f"{inline(heading(report, panel))}:", table_, *_legend(t), ""]
    return "\n".join(parts)


def markdown(report: Report, charts: bool = True) -> str:
    """``summary.md``: a table per dataset under a heading that names its settings (what differs
    from the defaults), how intervals were made, charts, runs left out."""
    src, b = report.source, report.baseline
    filters = ", ".join(f"{k}={v}" for k, v in src.items() if k not in ("uri", "experiment"))
    lines = [
        "# ablate comparison report",
        "",
        f"Experiment `{src.get('experiment')}` in `{src.get('uri')}`"
        + (f" ({inline(filters)})" if filters else "")
        + f": {report.runs.run_id.nunique()} runs used, "
        f"{int((report.excluded.status != 'MISSING').sum())} "
        f"left out{_missing(report)}. Every number is read from the runs' MLflow metrics.",
        "",
    ]
    for panel in report.summary.panel.unique():
        t = table(report, panel).drop(columns="dataset")
        numeric = [c for c in t.columns if c not in ("strategy", "lr", "interval")]
        lines += [f"## {inline(heading(report, panel))}", "", markdown_table(t, right=numeric)]
        lines += [*_legend(t), ""]
    lines += [
        "Metric values are the final model's (last epoch; with early stopping, the restored best "
        "epoch's), mean ± std over seeds. Train time is "
        "the time spent in training epochs (sum of `epoch_time_s`) and, with "
        "`trainer.cache_frozen`, in computing the frozen features once, without the dev "
        "evaluation after each epoch; the Trainer's runtime, which includes it, is "
        "`trainer_runtime_s` in summary.csv, and wall time is the whole run's. Train FLOPs "
        "counts the training steps' FLOPs actually executed (padding included; not the frozen "
        "features' one-off forward): machine-independent, unlike the times, "
        "which depend on the machine and on what else ran on it: they leave out runs measured "
        "on a loaded machine where the strategy has others (`timed_seeds` in summary.csv), and "
        f"a * marks times that only loaded runs measured. Δ vs `{b}`, on dev and on test, is "
        "paired by seed: a t-interval of the per-seed differences with 3 or more seeds, "
        "otherwise a percentile bootstrap over the split's items (words or sentences; "
        f"{N_BOOT} resamples, fixed RNG seed) when the runs logged their predictions on it; "
        "that bootstrap covers the choice of sentences, not seed-to-seed variation (the ± std "
        "shows that): run 3 or more seeds for an interval over seeds. McNemar's exact test "
        "(a binomial test of the items only one of the two runs got right) compares each "
        f"seed's run with `{b}`'s run of that seed on test items, where both runs' test "
        "predictions are held; its p is the largest of those seeds' (they share their test "
        "items, so their p-values are not independent, and combining them would overstate the "
        "evidence). Each p-value (the paired t's on dev and on test, McNemar's) is "
        f"Holm-adjusted across the strategies a table compares with `{b}`. The lr is the recipe's "
        "(`trainer.lr`) unless marked as picked on dev by the strategy's own lr study "
        "(`lr_study`, `python -m ablate.lrstudy`).",
        "",
    ]
    if report.notes:
        lines += ["Notes:", "", *[f"- {inline(n)}" for n in report.notes], ""]
    lines += per_tag.markdown(report)
    if charts:
        lines += ["## Charts", ""] + [f"![{c}]({c}.png)" for c in charts_of(report)] + [""]
    lines += ["## Runs left out", ""]
    if report.excluded.empty:  # a sweep's jobs without a run are rows of their own
        lines += ["None: every run found was used.", ""]
    else:
        ex = report.excluded.assign(
            run_name=report.excluded.run_name.fillna("–"), seed=report.excluded.seed.astype("Int64")
        )
        lines += [markdown_table(ex.rename(columns={"freeze": "strategy"})), ""]
    return "\n".join(lines)


def _missing(report: Report) -> str:
    n = int((report.excluded.status == "MISSING").sum())
    return f", {n} missing (no run: see Runs left out)" if n else ""


def charts_of(report: Report) -> tuple[str, ...]:
    """The charts ``report`` draws: ``CHARTS``, and ``CONFUSION`` where it has confusions."""
    return (*CHARTS, CONFUSION) if per_tag.shown(report) else CHARTS


def default_out_dir() -> Path:
    """``reports/`` at the project root (ignored by git)."""
    return project_root() / "reports"


def write(report: Report, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Write ``summary.csv``, ``summary.md``, ``runs.csv`` (the runs used), ``per_tag.csv``
    (where the report has per-tag accuracies) and one PNG per chart; return their paths by
    name."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no window, whatever the environment's default
    import matplotlib.pyplot as plt

    from ablate.report import charts

    out = Path(out_dir) if out_dir else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    paths = {n: out / n for n in ("summary.csv", "summary.md", "runs.csv")}
    report.summary.to_csv(paths["summary.csv"], index=False)
    swept = ["sweep"] if "sweep" in report.runs else []  # sweeps compared
    report.runs.reindex(columns=swept + RUN_COLUMNS).to_csv(paths["runs.csv"], index=False)
    # a file this report has none of is removed: an earlier report's would pass for this one's
    (out / "per_tag.csv").unlink(missing_ok=True)
    (out / f"{CONFUSION}.png").unlink(missing_ok=True)
    if report.per_tag is not None and not report.per_tag.table.empty:
        paths["per_tag.csv"] = out / "per_tag.csv"
        report.per_tag.table.to_csv(paths["per_tag.csv"], index=False)
    for name in charts_of(report):
        fig = getattr(charts, name)(report)
        paths[name] = out / f"{name}.png"
        fig.savefig(paths[name], dpi=120, bbox_inches="tight")
        plt.close(fig)
    paths["summary.md"].write_text(markdown(report), encoding="utf-8")
    return paths
