"""Reading a dataset's splits with its task's reader: label-checked, with a held-out test set
where the release has none, and train cut to ``data.max_train_sentences``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig

from ablate.data.files import SplitFiles
from ablate.data.sentences import Sentence, check_labels, hold_out
from ablate.errors import AblateError


def read_checked(
    path: Path, read: Callable, inventory: Sequence[str], lowercase: bool
) -> list[Sentence]:
    """``read(path)``, every label checked against ``inventory`` (an error names file:line)."""
    sentences = read(path, lowercase=lowercase)
    check_labels(sentences, inventory, str(path))
    return sentences


def read_splits(
    cfg: DictConfig, files: SplitFiles, read: Callable, inventory: Sequence[str]
) -> tuple[dict[str, list[Sentence]], str | None]:
    """The sentences of every split, and (``data.test_from_train``) what the test set holds.

    The test set is held out before ``max_train_sentences`` cuts train, so every run of a grid
    scores the same test set whatever its training size.
    """
    sentences = {
        split: read_checked(path, read, inventory, cfg.lowercase)
        for split, path in files.paths.items()
    }
    held = None
    if cfg.test_from_train is not None:
        seed = cfg.split_seed
        sentences["train"], sentences["test"] = hold_out(
            sentences["train"], cfg.test_from_train, seed, key=lambda s: s.words
        )
        held = (
            f"held out from train: {len(sentences['test'])} of {files.paths['train'].name}, "
            f"data.split_seed={seed}"
        )
    if cfg.max_train_sentences is not None:
        if cfg.max_train_sentences < 1:
            raise AblateError(
                f"data.max_train_sentences={cfg.max_train_sentences}: must be a positive number "
                f"(or null: all)"
            )
        sentences["train"] = sentences["train"][: cfg.max_train_sentences]
    return sentences, held
