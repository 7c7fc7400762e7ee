"""Reading a dataset's splits with its task's reader: label-checked, with a held-out test set
where the release has none, and train cut to ``data.max_train_sentences``.

With the cache on (``data.tokenized_cache``), a split file's sentences are kept under ``read/`` in
the cache folder, keyed by the file's sha256, the reader's code and the parser's version, so the
next job of a sweep loads them instead of parsing the file again (seconds per job for a UD
treebank).
"""

from __future__ import annotations

import importlib.metadata
import logging
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.data.dataset import code_version
from ablate.data.files import SplitFiles
from ablate.data.sentences import Sentence, check_labels, hold_out, sentence_blocks
from ablate.errors import AblateError

if TYPE_CHECKING:
    from ablate.config import DataCore

log = logging.getLogger(__name__)


def _read(
    path: Path, read: Callable, inventory: Sequence[str], lowercase: bool, **key: str
) -> list[Sentence]:
    """``read(path)`` with its labels checked; ``key`` only keys the cache."""
    sentences = read(path, lowercase=lowercase)
    check_labels(sentences, inventory, str(path))
    return sentences


def _read_pickled(
    path: Path, read: Callable, inventory: Sequence[str], lowercase: bool, **key: str
) -> bytes:
    """``_read`` as one pickle. joblib loads what it keeps with Python's own unpickler (it
    looks for numpy arrays inside), about 6x slower than the C one for a treebank's many small
    tuples: 0.8 s for EWT's train split, on every job of a sweep; one ``bytes`` object is one
    opcode for it, and ``pickle.loads`` does the rest."""
    return pickle.dumps(_read(path, read, inventory, lowercase), protocol=pickle.HIGHEST_PROTOCOL)


def _reader_version(read: Callable) -> str:
    """What a file's sentences depend on besides its bytes: the reader's module, the block
    splitter readers share, this module (the label check around the reader: joblib watches
    only the function it caches) and the CoNLL-U parser's version."""
    return "/".join(
        (
            code_version(read),
            code_version(sentence_blocks),
            code_version(_read),
            importlib.metadata.version("conllu"),
        )
    )


def read_checked(
    path: Path,
    read: Callable,
    inventory: Sequence[str],
    lowercase: bool,
    cache_dir: Path | None = None,
    sha256: str | None = None,
) -> list[Sentence]:
    """``read(path)``, every label checked against ``inventory`` (an error names file:line).

    With ``cache_dir`` and the file's ``sha256``, through joblib's cache there: the same bytes
    read by the same reader code load from it (errors are never cached).
    """
    if cache_dir is None or sha256 is None:
        return _read(path, read, inventory, lowercase)
    import joblib

    memory = joblib.Memory(Path(cache_dir).expanduser() / "read", verbose=0)
    # Neither the path (the same bytes elsewhere, a copy, read the same) nor the reader object
    # (a local function cannot be pickled for the hash) is part of the key: its name and code are.
    cached = memory.cache(_read_pickled, ignore=["path", "read"])
    reader = f"{read.__module__}.{read.__qualname__}"
    kept = cached(
        path, read, inventory, lowercase, sha256=sha256, reader=reader, code=_reader_version(read)
    )
    return pickle.loads(kept)


def read_splits(
    data: DataCore,
    files: SplitFiles,
    read: Callable,
    inventory: Sequence[str],
    cache_dir: Path | None = None,
) -> tuple[dict[str, list[Sentence]], str | None]:
    """The sentences of every split, and (``data.test_from_train``) what the test set holds;
    with ``cache_dir``, read through the cache (``read_checked``).

    The test set is held out before ``max_train_sentences`` cuts train, so every run of a grid
    scores the same test set whatever its training size.
    """
    t0 = time.perf_counter()
    sentences = {
        split: read_checked(
            path, read, inventory, data.lowercase, cache_dir, files.sha256.get(split)
        )
        for split, path in files.paths.items()
    }
    log.info("read %s in %.2f s", ", ".join(sentences), time.perf_counter() - t0)
    held = None
    if data.test_from_train is not None:
        seed = data.split_seed
        sentences["train"], sentences["test"] = hold_out(
            sentences["train"], data.test_from_train, seed, key=lambda s: s.words
        )
        held = (
            f"held out from train: {len(sentences['test'])} of {files.paths['train'].name}, "
            f"data.split_seed={seed}"
        )
    if data.max_train_sentences is not None:
        if data.max_train_sentences < 1:
            raise AblateError(
                f"data.max_train_sentences={data.max_train_sentences}: must be a positive number "
                f"(or null: all)"
            )
        sentences["train"] = sentences["train"][: data.max_train_sentences]
    return sentences, held
