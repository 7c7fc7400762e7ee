"""Metrics computed from predictions (never typed in).

Each task scores predictions with one ``evaluate_*`` function (``Task.evaluate``): label ids in,
an ``Evaluation`` out (metrics, the scored gold/predicted ids, report artifacts). The same
function gives the per-epoch dev metrics, the final dev/test metrics and extra test sets' metrics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.metrics import classification_report, confusion_matrix, f1_score

from ablate.labels import IGNORE


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


def _plain(obj):
    """numpy scalars in a (nested) report dict as Python numbers, for JSON."""
    return json.loads(json.dumps(obj, default=lambda x: x.item() if hasattr(x, "item") else str(x)))


def evaluate_tokens(
    predictions: np.ndarray, label_ids: np.ndarray, names: Sequence[str], reports: bool = True
) -> Evaluation:
    """Token classification scored per word: ``accuracy`` and ``words``; with ``reports`` the
    per-tag classification report (``classification_report.{txt,json}``)."""
    gold, pred = scored(np.asarray(predictions), np.asarray(label_ids))
    ev = Evaluation({"accuracy": accuracy(gold, pred), "words": float(gold.size)}, gold, pred)
    if reports:
        rep = report(gold, pred, names)
        ev.artifacts = {
            "classification_report.txt": rep["text"],
            "classification_report.json": rep["dict"],
        }
    return ev


def entity_rows(
    predictions: np.ndarray, label_ids: np.ndarray, names: Sequence[str]
) -> tuple[list[list[str]], list[list[str]]]:
    """(gold, predicted) tag sequences, one per encoded window, over the labelled positions.

    Each row is scored on its own, so the result does not depend on the order of the rows (the
    Trainer's evaluation may sort them by length). A sentence longer than ``data.max_length``
    sub-words is split into windows (``labels.encode``); an entity cut by that split counts as
    two (``<split>_windowed_sentences`` says how many sentences were split).
    """
    predictions, label_ids = np.asarray(predictions), np.asarray(label_ids)
    gold_rows, pred_rows = [], []
    for p_row, g_row in zip(predictions, label_ids, strict=True):
        mask = g_row != IGNORE
        if mask.any():
            gold_rows.append([names[i] for i in g_row[mask]])
            pred_rows.append([names[i] for i in p_row[mask]])
    return gold_rows, pred_rows


def evaluate_entities(
    predictions: np.ndarray, label_ids: np.ndarray, names: Sequence[str], reports: bool = True
) -> Evaluation:
    """IOB2 tagging scored per entity with seqeval: micro ``precision``/``recall``/``f1`` over
    entities (an entity counts only with its exact span and type), token ``accuracy`` and
    ``words``; with ``reports`` seqeval's per-type report (``classification_report.{txt,json}``).

    seqeval's default mode: it scores like the CoNLL shared task's conlleval script, which the
    published CoNLL-2003 results (and Hugging Face's seqeval metric) use. A predicted ``I-X``
    after ``O`` starts an entity there, where strict mode would drop it; on gold tags converted
    to IOB2 (``readers.iob1_to_iob2``) both modes read the same entities.
    """
    from seqeval.metrics import classification_report as entity_report
    from seqeval.metrics import f1_score as entity_f1
    from seqeval.metrics import precision_score, recall_score

    gold_rows, pred_rows = entity_rows(predictions, label_ids, names)
    gold, pred = scored(np.asarray(predictions), np.asarray(label_ids))
    kwargs = {"zero_division": 0}
    metrics = {
        "f1": float(entity_f1(gold_rows, pred_rows, **kwargs)),
        "precision": float(precision_score(gold_rows, pred_rows, **kwargs)),
        "recall": float(recall_score(gold_rows, pred_rows, **kwargs)),
        "accuracy": accuracy(gold, pred),
        "words": float(gold.size),
    }
    ev = Evaluation(metrics, gold, pred)
    if reports and gold_rows:
        ev.artifacts = {
            "classification_report.txt": entity_report(gold_rows, pred_rows, digits=4, **kwargs),
            "classification_report.json": _plain(
                entity_report(gold_rows, pred_rows, output_dict=True, **kwargs)
            ),
        }
    return ev


def evaluate_sequences(
    predictions: np.ndarray, label_ids: np.ndarray, names: Sequence[str], reports: bool = True
) -> Evaluation:
    """Sequence classification, one label per sentence: ``accuracy``, ``f1`` (of the second
    label, e.g. ``positive``, for two labels; macro-averaged for more) and ``sentences``; with
    ``reports`` the classification report and the confusion matrix
    (``confusion_matrix.{txt,json}``: rows gold, columns predicted)."""
    gold, pred = np.asarray(label_ids).reshape(-1), np.asarray(predictions).reshape(-1)
    keep = gold != IGNORE
    gold, pred = gold[keep], pred[keep]
    ids = list(range(len(names)))
    if len(names) == 2:
        f1 = f1_score(gold, pred, labels=ids, pos_label=1, average="binary", zero_division=0)
    else:
        f1 = f1_score(gold, pred, labels=ids, average="macro", zero_division=0)
    metrics = {"accuracy": accuracy(gold, pred), "f1": float(f1), "sentences": float(gold.size)}
    ev = Evaluation(metrics, gold, pred)
    if reports:
        rep = report(gold, pred, names)
        matrix = confusion_matrix(gold, pred, labels=ids)
        width = max(len(n) for n in names) + 2
        lines = ["gold \\ predicted".ljust(width) + "".join(n.rjust(width) for n in names)]
        lines += [
            name.ljust(width) + "".join(str(v).rjust(width) for v in row)
            for name, row in zip(names, matrix.tolist(), strict=True)
        ]
        ev.artifacts = {
            "classification_report.txt": rep["text"],
            "classification_report.json": _plain(rep["dict"]),
            "confusion_matrix.txt": "\n".join(lines) + "\n",
            "confusion_matrix.json": {"labels": list(names), "matrix": matrix.tolist()},
        }
    return ev
