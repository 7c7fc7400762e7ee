"""Part-of-speech tagging on Universal Dependencies treebanks: CoNLL-U in, 17 UPOS tags, word
accuracy, a token-classification head (datasets ``naija``, ``ewt``, ``ud``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ablate.data.sentences import Sentence, sentence_blocks
from ablate.errors import AblateError
from ablate.tasks.metrics import Evaluation, accuracy, report, scored

# The 17 universal POS tags, in the UD documentation's order: one fixed inventory, so a label id
# means the same tag for every treebank (and a tagger trained on one can score another).
UPOS = (
    "ADJ",
    "ADP",
    "ADV",
    "AUX",
    "CCONJ",
    "DET",
    "INTJ",
    "NOUN",
    "NUM",
    "PART",
    "PRON",
    "PROPN",
    "PUNCT",
    "SCONJ",
    "SYM",
    "VERB",
    "X",
)

_ID = re.compile(r"^(\d+)(?:-\d+|\.\d+)?$")  # word, multiword range (3-4) or empty node (8.1)


def _check_block(path: Path, numbers: list[int], lines: list[str]) -> None:
    # conllu parses what it is given without checking the column count or the id sequence, and
    # its errors carry no position; this check names file:line before anything is trained.
    expected = 1
    for number, line in zip(numbers, lines, strict=True):
        if line.startswith("#"):
            continue
        columns = line.split("\t")
        if len(columns) != 10:
            raise AblateError(
                f"{path}:{number}: {len(columns)} tab-separated columns; CoNLL-U lines have 10"
            )
        if any("  " in column for column in columns):  # conllu splits columns there too
            raise AblateError(
                f"{path}:{number}: a column holds two spaces in a row, which the CoNLL-U parser "
                f"reads as a column separator"
            )
        match = _ID.match(columns[0])
        if not match:
            raise AblateError(
                f"{path}:{number}: id {columns[0]!r} is not a word id, a range (3-4) or an "
                f"empty node (8.1)"
            )
        if columns[0].isdigit():
            if int(columns[0]) != expected:
                raise AblateError(
                    f"{path}:{number}: word id {columns[0]} where {expected} was expected "
                    f"(broken sentence: ids must run 1, 2, 3, ...)"
                )
            expected += 1


def read_conllu(path: Path, lowercase: bool = False) -> list[Sentence]:
    """Words and UPOS tags of a CoNLL-U file; multiword-token ranges and empty nodes are skipped.

    Malformed lines are an error naming ``file:line``; an empty file is an error.
    """
    import conllu

    sentences = []
    for numbers, lines in sentence_blocks(path):
        _check_block(path, numbers, lines)
        try:
            (tokenlist,) = conllu.parse("\n".join(lines) + "\n\n")
        except conllu.exceptions.ParseException as exc:  # its message has no position
            raise AblateError(f"{path}:{numbers[0]}-{numbers[-1]}: {exc}") from None
        # Ranges (3-4) and empty nodes (8.1) parse to tuples; only integer ids are words.
        words = [t for t in tokenlist if isinstance(t["id"], int)]
        word_lines = [
            n for n, line in zip(numbers, lines, strict=True) if line.split("\t")[0].isdigit()
        ]
        sentences.append(
            Sentence(
                words=tuple(t["form"].lower() if lowercase else t["form"] for t in words),
                labels=tuple(t["upos"] for t in words),
                lines=tuple(word_lines),
            )
        )
    if not sentences:
        raise AblateError(f"{path}: no sentences (an empty split file)")
    return sentences


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
