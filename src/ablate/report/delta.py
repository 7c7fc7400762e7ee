"""A strategy's runs against the baseline's, paired by seed (``versus``): the difference on dev
and on test, each with a 95 % interval and its paired-t p-value; McNemar's exact test per seed
on test items; Holm's adjustment across the comparisons of one panel (``adjust``); and where dev
and test disagree (``disagreement``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.report.stats import (
    Predictions,
    bootstrap_interval,
    holm,
    mcnemar_p,
    t_interval,
    t_test_p,
)  # fmt: skip

# summary.csv's columns of the difference on each split: Δ, its interval, how it was made, p
COLUMNS = {
    "dev": ("delta_dev_pt", "delta_ci_low_pt", "delta_ci_high_pt", "delta_method", "delta_dev_p"),
    "test": (
        "delta_test_pt", "delta_test_ci_low_pt", "delta_test_ci_high_pt", "delta_test_method",
        "delta_test_p",
    ),
}  # fmt: skip
MCNEMAR = ("mcnemar_tested", "mcnemar_seeds", "mcnemar_discordant", "mcnemar_method", "mcnemar_p")
# the p-values Holm adjusts within a panel, each as <name>_holm
ADJUSTED = ("delta_dev_p", "delta_test_p", "mcnemar_p")
BASELINE_METHOD = "baseline"


def _paired(cell: pd.DataFrame, b: pd.DataFrame, split: str, preds: Predictions, boot: dict):
    """Δ (pt), interval, method and p on ``split`` of ``cell``'s runs against the baseline's
    (``b``, indexed by seed): a paired t over 3 or more seeds; with fewer, a paired bootstrap over
    the split's items where both sides logged their predictions there (accuracy only: a mean over
    items)."""
    metric, items = cell.metric.iloc[0], f"{split} {cell['items'].iloc[0]}"
    nan = math.nan
    ours, theirs = cell[cell[split].notna()], b[b[split].notna()]
    if ours.empty or theirs.empty:
        return nan, nan, nan, f"none (no {split}_{metric} logged)", nan
    paired = ours[ours.seed.isin(theirs.index)]
    if paired.empty:
        delta = (ours[split].mean() - theirs[split].mean()) * 100
        return delta, nan, nan, "none (no seed in common with the baseline; unpaired means)", nan
    diffs = (paired[split].to_numpy() - theirs.loc[paired.seed, split].to_numpy()) * 100
    k, s = len(paired), "s" if len(paired) > 1 else ""
    if k >= 3:
        mean, lo, hi = t_interval(diffs)
        return mean, lo, hi, f"paired t over {k} seeds", t_test_p(diffs)
    per_item = metric == "accuracy"
    ids = [*paired.run_id, *theirs.loc[paired.seed, "run_id"]]
    correct = preds.correct(ids, split) if per_item else None
    if correct is None:
        why = f"no {split} predictions logged" if per_item else f"no per-item bootstrap of {metric}"
        return float(diffs.mean()), nan, nan, f"none ({k} paired seed{s}, {why})", nan
    per_item_diff = np.mean(correct[:k], axis=0) - np.mean(correct[k:], axis=0)
    lo, hi = bootstrap_interval(per_item_diff * 100, **boot)
    return float(diffs.mean()), lo, hi, f"paired bootstrap over {items} ({k} seed{s})", nan


def _mcnemar(cell: pd.DataFrame, b: pd.DataFrame, preds: Predictions) -> dict:
    """McNemar's exact test on test items between each seed's run and the baseline's run of that
    seed, where both logged their test predictions; the p kept is the largest of those seeds'
    (the seeds share their test items, so their p-values are not independent to combine)."""
    paired = cell[cell.seed.isin(b.index)]
    metric, items = cell.metric.iloc[0], f"test {cell['items'].iloc[0]}"
    out = {**dict.fromkeys(MCNEMAR, ""), "mcnemar_p": math.nan}
    if metric != "accuracy":
        out["mcnemar_method"] = f"none ({metric} is not a share of correct items)"
        return out
    if paired.empty:
        out["mcnemar_method"] = "none (no seed in common with the baseline)"
        return out
    tested = []
    for r in paired.itertuples():
        correct = preds.correct([r.run_id, b.loc[r.seed, "run_id"]], "test")
        if correct is not None:
            tested.append((r.seed, *mcnemar_p(*correct)))
    out["mcnemar_tested"] = f"{len(tested)} of {len(paired)} seed{'s' if len(paired) > 1 else ''}"
    if not tested:
        out["mcnemar_method"] = "none (no seed's test predictions held for both runs)"
        return out
    out["mcnemar_seeds"] = ",".join(str(seed) for seed, *_ in tested)
    # per seed: the items only this strategy got right / only the baseline got right
    out["mcnemar_discordant"] = "; ".join(f"{seed}: {a}/{c}" for seed, a, c, _ in tested)
    out["mcnemar_method"] = f"exact, per seed on {items}; the largest p"
    out["mcnemar_p"] = max(p for *_, p in tested)
    return out


def versus(cell: pd.DataFrame, base: pd.DataFrame, preds: Predictions, boot: dict) -> dict:
    """The columns that compare ``cell``'s runs (one per seed) with the baseline's runs ``base``
    (``COLUMNS``, ``MCNEMAR``); the baseline's own row says ``baseline``."""
    b = base.set_index("seed")
    out: dict = {}
    for split, names in COLUMNS.items():
        if cell.run_id.isin(base.run_id).all():
            values = (0.0, math.nan, math.nan, BASELINE_METHOD, math.nan)
        else:
            values = _paired(cell, b, split, preds, boot)
        out.update(zip(names, values, strict=True))
    if out["delta_method"] == BASELINE_METHOD:
        out.update({**dict.fromkeys(MCNEMAR, ""), "mcnemar_p": math.nan})
    else:
        out.update(_mcnemar(cell, b, preds))
    return out


def adjust(rows: list[dict]) -> None:
    """Holm's adjustment of each p-value in ``ADJUSTED`` across ``rows`` (one panel's: the family
    of its comparisons with the baseline), written as ``<name>_holm``; a row without a baseline
    to compare with is in no family."""
    family = [r for r in rows if r.get("delta_method") not in (None, BASELINE_METHOD)]
    for name in ADJUSTED:
        for row, p in zip(family, holm([r.get(name, math.nan) for r in family]), strict=True):
            row[f"{name}_holm"] = float(p)


def _verdict(low: float, high: float) -> str:
    return "lies below zero" if high < 0 else "lies above zero" if low > 0 else "includes zero"


def disagreement(
    dev: tuple[float, float, float], test: tuple[float, float, float], bounds: bool = True
) -> str:
    """How the differences (Δ, interval low, high) on dev and on test disagree, in words; empty
    where they agree: their intervals on different sides of zero, or one of them excluding zero
    and the other not; without both intervals, their signs. ``bounds``: each interval's bounds
    said too."""
    (d, d_low, d_high), (t, t_low, t_high) = dev, test
    if not any(math.isnan(x) for x in (d_low, d_high, t_low, t_high)):
        on_dev, on_test = _verdict(d_low, d_high), _verdict(t_low, t_high)
        if on_dev == on_test:
            return ""
        said = on_test.replace("zero", "it")
        if "includes" not in on_dev + on_test:  # on opposite sides of zero
            said = said.removeprefix("lies ")
        if not bounds:
            return f"dev's interval {on_dev}, test's {said}"
        return (
            f"dev's interval ({d_low:+.2f} to {d_high:+.2f}) {on_dev}, test's ({t_low:+.2f} to "
            f"{t_high:+.2f}) {said}"
        )
    if math.isnan(d) or math.isnan(t) or d * t >= 0:
        return ""
    return f"their signs differ (dev {d:+.2f}, test {t:+.2f}; without an interval on both)"


def disagreements(rows: list[dict]) -> list[str]:
    """A sentence per row (a summary row) whose differences on dev and on test disagree."""
    out = []
    for r in rows:
        dev, test = (tuple(r.get(c, math.nan) for c in COLUMNS[s][:3]) for s in ("dev", "test"))
        if said := disagreement(dev, test):
            out.append(f"`{r['strategy']}` against the baseline, dev and test disagree: {said}.")
    return out
