"""Intervals (scipy.stats) and the per-item correctness they resample: Student-t over seeds,
percentile bootstrap over dev items from each run's logged predictions."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from ablate.report.load import MlflowClient, MlflowException

LEVEL = 0.95
N_BOOT = 1000
# values a bootstrap resamples by their counts (below); more go through scipy's
MAX_LEVELS = 64


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Mean and Student-t interval of the mean of ``values`` (NaN bounds for fewer than 2)."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    lo, hi = stats.t.interval(level, x.size - 1, loc=mean, scale=stats.sem(x))
    return mean, float(lo), float(hi)


def bootstrap_interval(
    values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL
) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` resampled with replacement ``n_boot`` times
    (the same seed gives the same interval)."""
    values = np.asarray(values, dtype=float)
    if np.all(values == values[0]):  # no spread: every resample has the same mean
        return float(values[0]), float(values[0])
    rng = np.random.default_rng(seed)
    levels, counts = np.unique(values, return_counts=True)
    if levels.size <= MAX_LEVELS:
        # A resample's mean depends only on how many items of each value it drew: a multinomial
        # over the values' shares. Per-item correctness (0/1, averaged over a few seeds) has a
        # few values, so this draws n_boot x levels counts where scipy's bootstrap draws n_boot x
        # items indices (0.2 s per interval for EWT's dev words): the same distribution.
        drawn = rng.multinomial(values.size, counts / values.size, size=n_boot)
        means = drawn @ levels / values.size
        tail = (1 - level) / 2 * 100
        lo, hi = np.percentile(means, [tail, 100 - tail])
        return float(lo), float(hi)
    res = stats.bootstrap(
        (values,),
        np.mean,
        n_resamples=n_boot,
        confidence_level=level,
        method="percentile",
        random_state=rng,
        batch=100,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def load_predictions(uri: str, run_id: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Dev gold and predicted label ids of a run (``predictions/dev.json``), or None if absent."""
    client = MlflowClient(tracking_uri=uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, "predictions/dev.json", tmp)
            ids = json.loads(Path(path).read_text())
        except (MlflowException, OSError, ValueError):
            return None
    return np.asarray(ids["gold"]), np.asarray(ids["pred"])


class Predictions:
    """Per-run dev predictions, loaded once and only for the rows that need a bootstrap."""

    def __init__(self, uri: str, enabled: bool):
        self.uri, self.enabled, self.cache = uri, enabled, {}

    def correct(self, run_ids: Sequence[str]) -> list[np.ndarray] | None:
        """Word-level correctness (0/1) of each run, or None unless all share the same gold."""
        if not self.enabled:
            return None
        loaded = []
        for run_id in run_ids:
            if run_id not in self.cache:
                self.cache[run_id] = load_predictions(self.uri, run_id)
            loaded.append(self.cache[run_id])
        if any(p is None for p in loaded):
            return None
        gold = loaded[0][0]
        if any(g.shape != gold.shape or (g != gold).any() for g, _ in loaded):
            return None
        return [(pred == g).astype(float) for g, pred in loaded]
