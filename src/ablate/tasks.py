"""A task = reader + label scheme + metric + model head. Datasets pick theirs by ``data.task``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import AutoModelForTokenClassification

from ablate import data, labels, metrics


@dataclass(frozen=True)
class Task:
    """Everything that differs between tasks; the training loop is shared."""

    name: str
    labels: Sequence[str]
    read: Callable  # (path, lowercase) -> list[Sentence]
    encode: Callable  # (sentences, tokenizer, label2id, max_length) -> features
    compute_metrics: Callable  # Trainer hook: EvalPrediction -> {"accuracy": ..., "words": ...}
    model_class: type
    primary_metric: str = "accuracy"


TASKS: dict[str, Task] = {
    "pos": Task(
        name="pos",
        labels=labels.UPOS,
        read=data.read_conllu,
        encode=labels.encode,
        compute_metrics=metrics.token_accuracy,
        model_class=AutoModelForTokenClassification,
    ),
}


def get(name: str) -> Task:
    """The task called ``name``; an unknown name is an error listing the known ones."""
    from ablate.errors import AblateError

    if name not in TASKS:
        raise AblateError(f"data.task={name!r} is not one of {', '.join(sorted(TASKS))}")
    return TASKS[name]
