"""What every reader returns (``Sentence``), the blank-line blocks readers share, and the
seeded hold-out of a test set from train."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from ablate.errors import AblateError

T = TypeVar("T")


@dataclass(frozen=True)
class Sentence:
    """The gold words of one sentence and their labels (one per word).

    A sentence-classification example is one scored item: ``words`` holds the whole text and
    ``labels`` its label (``ablate.tasks.sst2``).
    """

    words: tuple[str, ...]
    labels: tuple[str, ...]
    lines: tuple[int, ...] = ()  # line of each word in its file, for error messages


def sentence_blocks(path: Path) -> Iterator[tuple[list[int], list[str]]]:
    """(line numbers, lines) of each blank-line-separated block, 1-based line numbers."""
    numbers: list[int] = []
    lines: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            line = line.rstrip("\n").rstrip("\r")
            if line.strip():
                numbers.append(number)
                lines.append(line)
            elif lines:
                yield numbers, lines
                numbers, lines = [], []
    if lines:
        yield numbers, lines


def check_labels(sentences: Sequence[Sentence], inventory: Sequence[str], source: str) -> None:
    """Raise naming ``file:line`` (or the sentence) of the first label outside ``inventory``."""
    allowed = set(inventory)
    for i, sentence in enumerate(sentences, start=1):
        for j, (word, label) in enumerate(zip(sentence.words, sentence.labels, strict=True)):
            if label not in allowed:
                where = (
                    f"{source}:{sentence.lines[j]}" if sentence.lines else f"{source}: sentence {i}"
                )
                raise AblateError(
                    f"{where}: word {word!r} has label {label!r}, not one of {', '.join(inventory)}"
                )


def hold_out(
    items: Sequence[T], fraction: float, seed: int, key: Callable[[T], Hashable] | None = None
) -> tuple[list[T], list[T]]:
    """(rest, held out): a seeded random ``fraction`` of ``items`` (rounded up, as scikit-learn's
    ``train_test_split``), both in their original order.

    Items with the same ``key`` (e.g. the same text: GLUE's SST-2 train.tsv repeats 371 of its
    sentences) go to the same side, so no held-out text is also trained on; the held-out part may
    then be a few items over the fraction. The same items, fraction and seed always give the same
    split.
    """
    if not 0 < fraction < 1:
        raise AblateError(f"data.test_from_train={fraction}: must be in (0, 1)")
    n_held = math.ceil(fraction * len(items))
    groups: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(i if key is None else key(item), []).append(i)
    members = list(groups.values())
    chosen = np.zeros(len(items), dtype=bool)
    held = 0
    for g in np.random.default_rng(seed).permutation(len(members)):
        if held >= n_held:
            break
        chosen[members[g]] = True
        held += len(members[g])
    if not 0 < held < len(items):
        raise AblateError(
            f"data.test_from_train={fraction}: holds out {held} of {len(items)} items; "
            f"both parts must be non-empty"
        )
    return (
        [x for x, c in zip(items, chosen, strict=True) if not c],
        [x for x, c in zip(items, chosen, strict=True) if c],
    )
