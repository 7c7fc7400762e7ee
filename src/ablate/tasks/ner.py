"""Named-entity recognition on CoNLL-2003: its 4-column files in (IOB1, converted to IOB2), 9
IOB2 tags, seqeval's entity F1, a token-classification head (dataset ``conll2003``).

Malformed input is an error naming ``file:line``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ablate.data.encode import IGNORE
from ablate.data.sentences import Sentence, sentence_blocks
from ablate.errors import AblateError
from ablate.tasks.metrics import Evaluation, accuracy, plain, scored

# CoNLL-2003's entity types, and its tags in IOB2 in a fixed order (the Hugging Face dataset's),
# so a label id means the same tag in every run.
ENTITY_TYPES = ("PER", "ORG", "LOC", "MISC")
NER_TAGS = ("O", *(f"{p}-{t}" for t in ENTITY_TYPES for p in ("B", "I")))

_TAG = re.compile(r"^(O|[BI]-\S+)$")
DOCSTART = "-DOCSTART-"


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 tags (``I-`` inside and at the start of an entity, ``B-`` only where an entity
    directly follows one of the same type) as IOB2 (every entity starts with ``B-``).

    An ``I-X`` that does not continue an entity of type X becomes ``B-X``; ``B-`` tags stay.
    """
    out: list[str] = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and previous[2:] != tag[2:]:  # "O"[2:] == "": never a type
            tag = f"B-{tag[2:]}"
        out.append(tag)
        previous = tag
    return out


def read_conll2003(path: Path, lowercase: bool = False) -> list[Sentence]:
    """Words and IOB2 NER tags of a CoNLL-2003 file (``word POS chunk NER``, tags in IOB1).

    ``-DOCSTART-`` lines (document separators, alone in their block) are dropped, so the
    sentence counts are the published ones (train 14041, testa 3250, testb 3453). A line without
    4 columns, a tag outside IOB1 (neither ``O`` nor ``B-``/``I-`` and a type: IOBES's ``E-``,
    ``S-`` say) or an entity type other than PER, ORG, LOC, MISC is an error naming
    ``file:line``; an empty file is an error. A ``B-X`` that follows no entity of type X (the
    release's train.txt has two) starts an entity, as IOB2 reads it.
    """
    sentences = []
    for numbers, lines in sentence_blocks(path):
        words, tags, word_lines = [], [], []
        for number, line in zip(numbers, lines, strict=True):
            columns = line.split()
            if columns[0] == DOCSTART:
                continue
            if len(columns) != 4:
                raise AblateError(
                    f"{path}:{number}: {len(columns)} columns; CoNLL-2003 lines have 4 "
                    f"(word POS chunk NER)"
                )
            if not _TAG.match(columns[3]):
                raise AblateError(
                    f"{path}:{number}: NER tag {columns[3]!r} is not IOB1 (O, B-<type>, I-<type>)"
                )
            if columns[3] != "O" and columns[3][2:] not in ENTITY_TYPES:  # before IOB1 -> IOB2
                raise AblateError(
                    f"{path}:{number}: NER tag {columns[3]!r}: entity type {columns[3][2:]!r} is "
                    f"not one of {', '.join(ENTITY_TYPES)}"
                )
            words.append(columns[0].lower() if lowercase else columns[0])
            tags.append(columns[3])
            word_lines.append(number)
        if words:
            sentences.append(Sentence(tuple(words), tuple(iob1_to_iob2(tags)), tuple(word_lines)))
    if not sentences:
        raise AblateError(f"{path}: no sentences (an empty split file)")
    return sentences


def entity_rows(
    predictions: np.ndarray, label_ids: np.ndarray, names: Sequence[str]
) -> tuple[list[list[str]], list[list[str]]]:
    """(gold, predicted) tag sequences, one per encoded window, over the labelled positions.

    Each row is scored on its own, so the result does not depend on the order of the rows (the
    Trainer's evaluation may sort them by length). A sentence longer than ``data.max_length``
    sub-words is split into windows (``ablate.data.encode``); an entity cut by that split counts as
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
    to IOB2 (``iob1_to_iob2``) both modes read the same entities.
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
            "classification_report.json": plain(
                entity_report(gold_rows, pred_rows, output_dict=True, **kwargs)
            ),
        }
    return ev
