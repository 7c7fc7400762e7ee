"""What every task's metric shares: an ``Evaluation`` and the helpers that fill it.

Each task scores predictions with one ``evaluate`` function (``Task.evaluate``): label ids in, an
``Evaluation`` out (metrics, the scored gold/predicted ids, report artifacts). The same function
gives the per-epoch dev metrics, the final dev/test metrics and extra test sets' metrics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ablate.data.encode import IGNORE


@dataclass
class Evaluation:
    """Scores of one split.

    ``metrics``: name -> value (the task's primary metric among them, and the number of scored
    items under the task's ``item_name``); ``gold``/``pred``: label ids per scored item (word or
    sentence) in dataset order; ``artifacts``: file name -> text (str) or a JSON-able object.
    """

    metrics: dict[str, float]
    gold: np.ndarray
    pred: np.ndarray
    artifacts: dict[str, Any] = field(default_factory=dict)


def scored(predictions: np.ndarray, label_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flatten to (gold, predicted) ids over the positions that carry a label."""
    mask = label_ids != IGNORE
    return label_ids[mask], predictions[mask]


def accuracy(gold: np.ndarray, pred: np.ndarray) -> float:
    """Fraction of equal ids (0.0 for no words)."""
    return float((gold == pred).mean()) if gold.size else 0.0


def argmax_logits(logits, labels):
    """``preprocess_logits_for_metrics`` hook: keep class ids, not logits, across eval batches."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def report(gold: np.ndarray, pred: np.ndarray, names: Sequence[str]) -> dict:
    """Per-label precision/recall/F1/support as text and as a dict (scikit-learn)."""
    from sklearn.metrics import classification_report

    kwargs = dict(labels=list(range(len(names))), target_names=list(names), zero_division=0)
    return {
        "text": classification_report(gold, pred, digits=4, **kwargs),
        "dict": classification_report(gold, pred, output_dict=True, **kwargs),
    }


def plain(obj):
    """numpy scalars in a (nested) report dict as Python numbers, for JSON."""
    return json.loads(json.dumps(obj, default=lambda x: x.item() if hasattr(x, "item") else str(x)))
