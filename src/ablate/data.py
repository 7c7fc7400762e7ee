"""Finding, fetching and reading dataset files (``conf/data``)."""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import conllu
import numpy as np
from omegaconf import DictConfig

from ablate.errors import AblateError

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
T = TypeVar("T")


@dataclass(frozen=True)
class Sentence:
    """The gold words of one sentence and their labels (one per word).

    A sentence-classification example is one scored item: ``words`` holds the whole text and
    ``labels`` its label (``ablate.readers.read_sst2``).
    """

    words: tuple[str, ...]
    labels: tuple[str, ...]
    lines: tuple[int, ...] = ()  # line of each word in its file, for error messages


@dataclass(frozen=True)
class SplitFiles:
    """Located split files with their sha256."""

    paths: dict[str, Path]
    sha256: dict[str, str]


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes; read once per process while its size and mtime stay (a job
    hashes its data and model files for its identity and again for the run's record)."""
    stat = Path(path).stat()
    return _sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(url: str, sha256: str | None, dest: Path, hint: str | None = None) -> Path:
    """Download ``url`` to ``dest`` with a progress bar, keeping it only if its sha256 matches.

    pooch downloads to a temporary file and moves it into place only after the hash check,
    so a failed or corrupt download leaves nothing behind. ``hint`` (where to put the file by
    hand) ends the error message of a failed download.
    """
    import pooch

    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        pooch.retrieve(
            url,
            known_hash=f"sha256:{sha256}" if sha256 else None,
            fname=dest.name,
            path=dest.parent,
            progressbar=True,
        )
    except ValueError as exc:  # pooch's hash mismatch
        raise AblateError(
            f"{url}: downloaded file failed its sha256 check ({exc}); not kept"
        ) from exc
    except Exception as exc:  # network errors come in many types (requests, OSError, ...)
        hint = hint or (
            f"Put the file at {dest} yourself, or set ABLATE_DATA_DIR to a folder laid out like "
            f"<root>/{dest.parent.name}/{dest.name}"
        )
        raise AblateError(
            f"could not download {url} ({type(exc).__name__}: {exc}). {hint}"
        ) from exc
    return dest


def file_splits(cfg: DictConfig) -> tuple[str, ...]:
    """The splits read from files: all three, or train and dev when ``data.test_from_train``
    holds the test set out of train (a dataset whose published test split has no labels)."""
    return SPLITS if cfg.get("test_from_train") is None else ("train", "dev")


def locate(cfg: DictConfig) -> SplitFiles:
    """Find (and, for pinned releases, download and verify) the split files of ``cfg``
    (``file_splits``)."""
    folder = Path(cfg.root) / cfg.dir
    paths: dict[str, Path] = {}
    needed = file_splits(cfg)
    if cfg.splits:
        for split in needed:
            if split not in cfg.splits:
                raise AblateError(f"data.splits of '{cfg.name}' has no '{split}' entry")
        missing = [
            cfg.splits[s].file for s in needed if not (folder / cfg.splits[s].file).is_file()
        ]
        hint = (
            f"Put {', '.join(missing)} into {folder} yourself, or set ABLATE_DATA_DIR (or "
            f"data.root) to a folder laid out like <root>/{cfg.dir}/{{{', '.join(missing)}}}"
        )
        for split in needed:
            spec = cfg.splits[split]
            path = folder / spec.file
            if not path.is_file():
                if not spec.url:
                    raise AblateError(
                        f"{path}: missing, and data.splits.{split}.url is not set. {hint}"
                    )
                log.info("downloading %s -> %s", spec.url, path)
                fetch(spec.url, spec.sha256, path, hint)
            paths[split] = path
    else:
        if not folder.is_dir():
            raise AblateError(
                f"{folder}: no such folder (data.root={cfg.root}, data.dir={cfg.dir}). "
                f"Set data.root or ABLATE_DATA_DIR to a folder laid out like <root>/ud/UD_<Name>/"
            )
        for split in needed:
            found = sorted(folder.glob(f"*-ud-{split}.conllu"))
            if len(found) != 1:
                raise AblateError(
                    f"{folder}: expected exactly one *-ud-{split}.conllu file, found "
                    f"{len(found)} ({', '.join(p.name for p in found) or 'none'})"
                )
            paths[split] = found[0]
    sha = {split: sha256_of(path) for split, path in paths.items()}
    for split, path in paths.items():
        pinned = cfg.splits[split].sha256 if cfg.splits else None
        if pinned and sha[split] != pinned:
            release = f"{cfg.name} r{cfg.version}" if cfg.get("version") else cfg.name
            raise AblateError(
                f"{path}: sha256 {sha[split]} differs from the pinned {pinned} of {release}; use "
                f"the published file (data.splits.{split}.url), or set "
                f"data.splits.{split}.sha256=null to use this one"
            )
    return SplitFiles(paths=paths, sha256=sha)


_ID = re.compile(r"^(\d+)(?:-\d+|\.\d+)?$")  # word, multiword range (3-4) or empty node (8.1)


def _sentence_blocks(path: Path):
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
    sentences = []
    for numbers, lines in _sentence_blocks(path):
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


def extra_test_paths(cfg: DictConfig) -> list[Path]:
    """The ``data.extra_test`` files: each absolute, or relative to the working directory or to
    ``data.root``; a missing one is an error."""
    paths = []
    for given in cfg.extra_test or []:
        path = Path(given).expanduser()
        if not path.is_absolute() and not path.is_file():
            path = Path(cfg.root) / path
        if not path.is_file():
            raise AblateError(
                f"data.extra_test: {given}: no such file (give it absolute, or relative to the "
                f"working directory or to data.root={cfg.root})"
            )
        paths.append(path)
    return paths


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
