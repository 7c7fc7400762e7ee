"""Per-epoch metric histories as MLflow stores them. Light: imports nothing of MLflow."""

from __future__ import annotations

from collections.abc import Sequence


def latest_per_step(points: Sequence) -> dict[int, float]:
    """MLflow metric points as {step: value}, in step order, the latest point of each step (a
    resumed run logs again the epochs its checkpoint did not hold)."""
    latest = {}
    for m in sorted(points, key=lambda m: (m.step, m.timestamp)):
        latest[m.step] = m.value
    return latest
