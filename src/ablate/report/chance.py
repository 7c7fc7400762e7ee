"""Chance level: the dev accuracy of always answering a panel's most frequent gold label (its
majority tag or class), counted from a run's logged dev predictions, and the strategies whose
score sits near it (they learned little: a chart of accuracies near 95 % would not show it)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ablate.report.stats import Predictions

MARGIN_PT = 5.0  # within this many points of chance, a strategy is said to sit at it


def level(group: pd.DataFrame, preds: Predictions) -> float:
    """The majority label's share (%) of the dev items of ``group``'s runs (one panel: they share
    their gold), from the first run that logged dev predictions; NaN for another metric than
    accuracy, or where none did."""
    if (group.metric != "accuracy").any():
        return math.nan
    for run_id in group.run_id:
        if (ids := preds.ids(run_id, "dev")) is not None and len(ids[0]):
            counts = np.unique(ids[0], return_counts=True)[1]
            return float(100 * counts.max() / counts.sum())
    return math.nan


def at_chance(dev_pct: float, chance_pct: float) -> bool:
    """Whether a dev accuracy (%) lies within ``MARGIN_PT`` of the chance level."""
    return not math.isnan(chance_pct) and dev_pct <= chance_pct + MARGIN_PT


def notes(panel: str, rows: list[dict]) -> list[str]:
    """One note per strategy of ``panel`` that sits at chance level."""
    return [
        f"{panel}: `{r['strategy']}` scores {r['dev_mean_pct']:.2f} % dev accuracy, within "
        f"{MARGIN_PT:g} points of always answering the most frequent label "
        f"({r['chance_pct']:.2f} %): it sits at chance level."
        for r in rows
        if r["at_chance"]
    ]
