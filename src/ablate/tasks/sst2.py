"""Sentence classification on GLUE SST-2: its tables in, negative/positive, accuracy (and F1,
confusion matrix), a sequence-classification head (dataset ``sst2``; GLUE's test split has no
labels, so a seeded share of train is the test set: ``data.test_from_train``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ablate.data.encode import IGNORE
from ablate.data.sentences import Sentence
from ablate.errors import AblateError
from ablate.tasks.metrics import Evaluation, accuracy, plain, report

# GLUE SST-2's label column: 0 = negative, 1 = positive.
SST2_LABELS = ("negative", "positive")


def read_sst2(path: Path, lowercase: bool = False) -> list[Sentence]:
    """Sentences and labels of a GLUE SST-2 ``train.tsv``/``dev.tsv`` (header ``sentence\\tlabel``).

    Each row is one item: ``words`` = (the sentence,), ``labels`` = (``negative``/``positive``,).
    GLUE's ``test.tsv`` has no labels and is refused; a row without 2 tab-separated fields, an
    empty sentence or a label other than 0/1 is an error naming ``file:line``.
    """
    items = []
    with open(path, encoding="utf-8") as fh:
        header = fh.readline().rstrip("\r\n")
        if header.split("\t") != ["sentence", "label"]:
            raise AblateError(
                f"{path}:1: header {header!r}, expected 'sentence<TAB>label' (GLUE SST-2 train.tsv "
                f"or dev.tsv; GLUE's test.tsv has no labels)"
            )
        for number, line in enumerate(fh, start=2):
            line = line.rstrip("\r\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise AblateError(
                    f"{path}:{number}: {len(fields)} tab-separated fields; SST-2 rows have 2 "
                    f"(sentence, label)"
                )
            text, label = fields[0].strip(), fields[1].strip()
            if not text:
                raise AblateError(f"{path}:{number}: empty sentence")
            if label not in ("0", "1"):
                raise AblateError(f"{path}:{number}: label {label!r} is not 0 or 1")
            items.append(
                Sentence(
                    (text.lower() if lowercase else text,), (SST2_LABELS[int(label)],), (number,)
                )
            )
    if not items:
        raise AblateError(f"{path}: no sentences (an empty split file)")
    return items


def encode_texts(
    items: Sequence[Sentence],
    tokenizer,
    label2id: dict[str, int],
    max_length: int,
    stats: dict[str, int] | None = None,
) -> list[dict]:
    """Tokenise one-text items (``read_sst2``) into model inputs with one label id each.

    Texts longer than ``max_length`` sub-words are cut (the earlier study's recipe);
    ``stats``, if given, receives the count of ``truncated_sentences``.
    """
    counts = {"truncated_sentences": 0}
    if stats is not None:
        stats.update(counts)
        counts = stats
    if not items:
        return []
    texts = [item.words[0] for item in items]
    full = tokenizer(texts)["input_ids"]
    counts["truncated_sentences"] += sum(len(ids) > max_length for ids in full)
    enc = tokenizer(texts, truncation=True, max_length=max_length)
    return [
        {
            "input_ids": enc["input_ids"][i],
            "attention_mask": enc["attention_mask"][i],
            "labels": label2id[item.labels[0]],
        }
        for i, item in enumerate(items)
    ]


def evaluate_sequences(
    predictions: np.ndarray, label_ids: np.ndarray, names: Sequence[str], reports: bool = True
) -> Evaluation:
    """Sequence classification, one label per sentence: ``accuracy``, ``f1`` (of the second
    label, e.g. ``positive``, for two labels; macro-averaged for more) and ``sentences``; with
    ``reports`` the classification report and the confusion matrix
    (``confusion_matrix.{txt,json}``: rows gold, columns predicted)."""
    from sklearn.metrics import confusion_matrix, f1_score

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
            "classification_report.json": plain(rep["dict"]),
            "confusion_matrix.txt": "\n".join(lines) + "\n",
            "confusion_matrix.json": {"labels": list(names), "matrix": matrix.tolist()},
        }
    return ev
