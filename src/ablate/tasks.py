"""A task = reader + label scheme + metric + model head. Datasets pick theirs by ``data.task``.

The training loop (``ablate.trainer``) is shared; everything that differs between tasks is here:

| task | datasets | reads | labels | model | primary metric |
|---|---|---|---|---|---|
| ``pos`` | ``naija``, ``ewt``, ``ud`` | CoNLL-U | 17 UPOS tags | token classification | accuracy |
| ``ner`` | ``conll2003`` | CoNLL-2003 (IOB1 -> IOB2) | 9 IOB2 tags | token classification | f1 |
| ``sst2`` | ``sst2`` | GLUE tsv | negative/positive | sequence classification | accuracy |
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
)

from ablate import data, labels, metrics, readers


@dataclass(frozen=True)
class Task:
    """Everything that differs between tasks; the training loop is shared.

    ``read(path, lowercase) -> list[Sentence]``; ``encode(sentences, tokenizer, label2id,
    max_length, stats) -> features``; ``evaluate(predictions, label_ids, label_names, reports)
    -> metrics.Evaluation`` scores dev (every epoch), dev and test (at the end) and extra test
    sets; ``collator(tokenizer)`` pads batches. ``primary_metric`` is logged per epoch as
    ``dev_<primary>`` and decides ``best_dev_<primary>``, early stopping and the report's
    headline; ``epoch_metrics`` are the other dev metrics logged per epoch. ``item_name`` names
    the scored items in counts (``dev_words``, ``test_sentences``). ``extra_test``: whether
    ``data.extra_test`` files (CoNLL-U) can be scored.
    """

    name: str
    labels: Sequence[str]
    read: Callable
    encode: Callable
    evaluate: Callable[..., metrics.Evaluation]
    model_class: type
    collator: Callable
    primary_metric: str = "accuracy"
    epoch_metrics: tuple[str, ...] = ()
    item_name: str = "words"
    extra_test: bool = False

    def compute_metrics(self, eval_pred) -> dict[str, float]:
        """``compute_metrics`` hook of the Trainer: the metrics of ``evaluate``, no reports."""
        return self.evaluate(
            np.asarray(eval_pred.predictions),
            np.asarray(eval_pred.label_ids),
            self.labels,
            reports=False,
        ).metrics


TASKS: dict[str, Task] = {
    "pos": Task(
        name="pos",
        labels=labels.UPOS,
        read=data.read_conllu,
        encode=labels.encode,
        evaluate=metrics.evaluate_tokens,
        model_class=AutoModelForTokenClassification,
        collator=DataCollatorForTokenClassification,
        extra_test=True,
    ),
    "ner": Task(
        name="ner",
        labels=readers.NER_TAGS,
        read=readers.read_conll2003,
        encode=labels.encode,  # first sub-word of each word carries its tag, as for pos
        evaluate=metrics.evaluate_entities,
        model_class=AutoModelForTokenClassification,
        collator=DataCollatorForTokenClassification,
        primary_metric="f1",
        epoch_metrics=("accuracy",),
    ),
    "sst2": Task(
        name="sst2",
        labels=readers.SST2_LABELS,
        read=readers.read_sst2,
        encode=readers.encode_texts,
        evaluate=metrics.evaluate_sequences,
        model_class=AutoModelForSequenceClassification,
        collator=DataCollatorWithPadding,
        epoch_metrics=("f1",),
        item_name="sentences",
    ),
}


def get(name: str) -> Task:
    """The task called ``name``; an unknown name is an error listing the known ones."""
    from ablate.errors import AblateError

    if name not in TASKS:
        raise AblateError(f"data.task={name!r} is not one of {', '.join(sorted(TASKS))}")
    return TASKS[name]
