"""Readers of the non-UD datasets: CoNLL-2003 NER files and GLUE SST-2 tables.

Each returns ``data.Sentence`` items, so label checks (``labels.check_labels``), the tokenised
cache and ``data.max_train_sentences`` work the same for every task. Malformed input is an error
naming ``file:line``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from ablate.data import Sentence, _sentence_blocks
from ablate.errors import AblateError

# CoNLL-2003's entity types, and its tags in IOB2 in a fixed order (the Hugging Face dataset's),
# so a label id means the same tag in every run.
ENTITY_TYPES = ("PER", "ORG", "LOC", "MISC")
NER_TAGS = ("O", *(f"{p}-{t}" for t in ENTITY_TYPES for p in ("B", "I")))

# GLUE SST-2's label column: 0 = negative, 1 = positive.
SST2_LABELS = ("negative", "positive")

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
    4 columns, with a tag that is neither ``O`` nor ``B-``/``I-``, or with an entity type other
    than PER, ORG, LOC, MISC is an error naming ``file:line``; an empty file is an error.
    """
    sentences = []
    for numbers, lines in _sentence_blocks(path):
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
                    f"{path}:{number}: NER tag {columns[3]!r} is neither O nor B-<type>/I-<type>"
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
