"""Metrics computed from predictions (never typed in)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import classification_report

from ablate.labels import IGNORE


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


def token_accuracy(eval_pred) -> dict[str, float]:
    """``compute_metrics`` hook for token classification: word-level accuracy and word count."""
    gold, pred = scored(np.asarray(eval_pred.predictions), np.asarray(eval_pred.label_ids))
    return {"accuracy": accuracy(gold, pred), "words": float(gold.size)}


def report(gold: np.ndarray, pred: np.ndarray, names: Sequence[str]) -> dict:
    """Per-label precision/recall/F1/support as text and as a dict (scikit-learn)."""
    kwargs = dict(labels=list(range(len(names))), target_names=list(names), zero_division=0)
    return {
        "text": classification_report(gold, pred, digits=4, **kwargs),
        "dict": classification_report(gold, pred, output_dict=True, **kwargs),
    }
