"""Intervals and tests (scipy.stats) and the per-item correctness they read: Student-t over
seeds, percentile bootstrap over items from each run's logged predictions, McNemar's exact test
between two runs' predictions, Holm's adjustment of a family of p-values."""

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


def t_test_p(values: Sequence[float]) -> float:
    """Two-sided p-value of Student's t-test that the mean of ``values`` is 0 (the test behind
    ``t_interval``: its interval excludes 0 exactly where p < 1 - level); NaN for fewer than 2."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return math.nan
    if np.all(x == x[0]):  # no spread: scipy's t is undefined; the interval is the point
        return 1.0 if x[0] == 0 else 0.0
    return float(stats.ttest_1samp(x, 0.0).pvalue)


def mcnemar_p(ours: np.ndarray, theirs: np.ndarray) -> tuple[int, int, float]:
    """McNemar's exact test between two runs scored on the same items (``ours``, ``theirs``:
    correctness, 0/1 per item): the items only ours got right, those only theirs got right, and
    the two-sided binomial p-value of that split (1 where they never disagree)."""
    ours, theirs = np.asarray(ours, dtype=bool), np.asarray(theirs, dtype=bool)
    only_ours, only_theirs = int((ours & ~theirs).sum()), int((~ours & theirs).sum())
    if only_ours + only_theirs == 0:
        return 0, 0, 1.0
    return only_ours, only_theirs, float(stats.binomtest(only_ours, only_ours + only_theirs).pvalue)


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values (NaN ones are not in the family and
    stay NaN). Written here: scipy has no Holm, and statsmodels is not a dependency."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, math.nan)
    known = np.flatnonzero(~np.isnan(p))
    order = known[np.argsort(p[known], kind="stable")]
    m = order.size
    # the i-th smallest (from 0) times the m - i hypotheses left, never below an earlier one's
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    return out


def load_predictions(
    uri: str, run_id: str, split: str = "dev"
) -> tuple[np.ndarray, np.ndarray] | None:
    """Gold and predicted label ids of a run on ``split`` (``predictions/<split>.json``), or None
    if absent."""
    client = MlflowClient(tracking_uri=uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, f"predictions/{split}.json", tmp)
            ids = json.loads(Path(path).read_text())
        except (MlflowException, OSError, ValueError):
            return None
    return np.asarray(ids["gold"]), np.asarray(ids["pred"])


class Predictions:
    """Per-run predictions on dev or test, each loaded once and only where a row needs it."""

    def __init__(self, uri: str, enabled: bool):
        self.uri, self.enabled, self.cache = uri, enabled, {}

    def ids(self, run_id: str, split: str = "dev") -> tuple[np.ndarray, np.ndarray] | None:
        """Gold and predicted label ids of a run on ``split`` (``load_predictions``), or None
        where it logged none there or predictions are not read."""
        if not self.enabled:
            return None
        if (run_id, split) not in self.cache:
            self.cache[run_id, split] = load_predictions(self.uri, run_id, split)
        return self.cache[run_id, split]

    def correct(self, run_ids: Sequence[str], split: str = "dev") -> list[np.ndarray] | None:
        """Item-level correctness (0/1) of each run on ``split``, or None unless every run logged
        its predictions there and all share the same gold."""
        loaded = [self.ids(run_id, split) for run_id in run_ids]
        if any(p is None for p in loaded):
            return None
        gold = loaded[0][0]
        if any(g.shape != gold.shape or (g != gold).any() for g, _ in loaded):
            return None
        return [(pred == g).astype(float) for g, pred in loaded]
