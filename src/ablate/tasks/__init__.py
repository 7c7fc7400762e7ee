"""A task = reader + label scheme + metric + model head. Datasets pick theirs by ``data.task``.

The training loop (``ablate.training``) is shared; everything that differs between tasks is in
one file per task, registered here:

| task | datasets | reads | labels | model head | primary metric |
|---|---|---|---|---|---|
| ``pos`` | ``naija``, ``ewt``, ``ud`` | CoNLL-U | 17 UPOS tags | token classification | accuracy |
| ``ner`` | ``conll2003`` | CoNLL-2003 (IOB1 -> IOB2) | 9 IOB2 tags | token classification | f1 |
| ``sst2`` | ``sst2`` | GLUE tsv | negative/positive | sequence classification | accuracy |

A new task is a ``Task`` passed to ``register`` (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ablate.errors import AblateError
from ablate.tasks.metrics import Evaluation

HEADS = ("token", "sequence")  # the task model: a label per token, or one per sequence


@dataclass(frozen=True)
class Task:
    """Everything that differs between tasks; the training loop is shared.

    ``read(path, lowercase) -> list[Sentence]``; ``encode(sentences, tokenizer, label2id,
    max_length, stats) -> features``; ``evaluate(predictions, label_ids, label_names, reports)
    -> Evaluation`` scores dev (every epoch), dev and test (at the end) and extra test sets;
    ``head``: ``token`` or ``sequence`` classification. ``primary_metric`` is logged per epoch
    as ``dev_<primary>`` and decides ``best_dev_<primary>``, early stopping and the report's
    headline; ``epoch_metrics`` are the other dev metrics logged per epoch. ``item_name`` names
    the scored items in counts (``dev_words``, ``test_sentences``). ``extra_test``: whether
    ``data.extra_test`` files (CoNLL-U) can be scored.
    """

    name: str
    labels: Sequence[str]
    read: Callable
    encode: Callable
    evaluate: Callable[..., Evaluation]
    head: str = "token"
    primary_metric: str = "accuracy"
    epoch_metrics: tuple[str, ...] = ()
    item_name: str = "words"
    extra_test: bool = False

    @property
    def model_class(self) -> type:
        """The ``transformers`` Auto class of the task model."""
        import transformers

        return {
            "token": transformers.AutoModelForTokenClassification,
            "sequence": transformers.AutoModelForSequenceClassification,
        }[self.head]

    def collator(self, tokenizer) -> Callable:
        """The collator that pads this task's batches."""
        import transformers

        if self.head == "token":
            return transformers.DataCollatorForTokenClassification(tokenizer)
        return transformers.DataCollatorWithPadding(tokenizer)

    def compute_metrics(self, eval_pred) -> dict[str, float]:
        """``compute_metrics`` hook of the Trainer: the metrics of ``evaluate``, no reports."""
        return self.evaluate(
            np.asarray(eval_pred.predictions),
            np.asarray(eval_pred.label_ids),
            self.labels,
            reports=False,
        ).metrics


TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add ``task`` to the registry (``data.task`` picks it by name); returns it."""
    if task.head not in HEADS:
        raise AblateError(f"task {task.name!r}: head {task.head!r} is not one of {HEADS}")
    TASKS[task.name] = task
    return task


def get(name: str) -> Task:
    """The task called ``name``; an unknown name is an error listing the known ones."""
    if name not in TASKS:
        raise AblateError(f"data.task={name!r} is not one of {', '.join(sorted(TASKS))}")
    return TASKS[name]


def _register_builtin() -> None:
    from ablate.data.encode import encode_words
    from ablate.tasks import ner, pos, sst2

    register(
        Task("pos", pos.UPOS, pos.read_conllu, encode_words, pos.evaluate_tokens, extra_test=True)
    )
    register(
        Task(
            "ner",
            ner.NER_TAGS,
            ner.read_conll2003,
            encode_words,
            ner.evaluate_entities,
            primary_metric="f1",
            epoch_metrics=("accuracy",),
        )
    )
    register(
        Task(
            "sst2",
            sst2.SST2_LABELS,
            sst2.read_sst2,
            sst2.encode_texts,
            sst2.evaluate_sequences,
            head="sequence",
            epoch_metrics=("f1",),
            item_name="sentences",
        )
    )


_register_builtin()
