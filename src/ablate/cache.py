"""Tokenised splits cached on disk and reused across runs (``data.tokenized_cache``).

A sweep runs the same (dataset, tokenizer, max_length) once per strategy and seed; tokenising it
again each time is waste. Each split's features are stored under a sha256 of everything they
depend on: the sentences themselves (words, labels: so the file, ``lowercase`` and
``max_train_sentences`` are covered), ``max_length``, the label inventory, the tokenizer (its full
serialised definition: vocabulary, normaliser, special tokens) and the source of the encoder's
module. Files are ``.npz`` read with ``allow_pickle=False`` and written to a temporary name, then
renamed, so parallel jobs never read half a file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the file layout changes


def default_dir() -> Path:
    """``<user cache>/ablate/tokenized`` (e.g. ``~/.cache/ablate/tokenized``)."""
    import pooch

    return Path(pooch.os_cache("ablate")) / "tokenized"


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides a tokenizer's output: its full definition, not its path."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        # Each call sets these on the backend (the encoder passes its own): state, not identity.
        definition.pop("truncation", None)
        definition.pop("padding", None)
        definition = json.dumps(definition, sort_keys=True)
    else:  # a slow (Python) tokenizer: its vocabulary and settings
        definition = json.dumps(
            [tokenizer.get_vocab(), getattr(tokenizer, "do_lower_case", None)], sort_keys=True
        )
    specials = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    # truncation_side lives on the Python tokenizer, not in the backend's definition
    side = getattr(tokenizer, "truncation_side", None)
    text = f"{type(tokenizer).__name__}\n{side}\n{specials}\n{definition}"
    return hashlib.sha256(text.encode()).hexdigest()


def _code_version(fn) -> str:
    try:
        source = Path(inspect.getsourcefile(fn)).read_bytes()
    except (TypeError, OSError):
        source = repr(fn).encode()
    return hashlib.sha256(source).hexdigest()


def key(
    sentences: Sequence[Any],
    encode,
    tokenizer_id: str,
    label2id: Mapping[str, int],
    max_length: int,
) -> str:
    """The cache key of one split: sha256 over its content and everything encoding depends on
    (``tokenizer_id``: ``tokenizer_fingerprint``)."""
    digest = hashlib.sha256()
    header = {
        "format": FORMAT,
        "encoder": f"{encode.__module__}.{encode.__qualname__}",
        "encoder_source": _code_version(encode),
        "tokenizer": tokenizer_id,
        "labels": sorted(label2id.items(), key=lambda kv: kv[1]),
        "max_length": max_length,
        "n": len(sentences),
        # word_ids() and pre-split tokenisation come from these: an upgrade may change features
        "versions": [importlib.metadata.version(p) for p in ("transformers", "tokenizers")],
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    for sentence in sentences:  # frozen dataclasses of tuples: a deterministic repr
        digest.update(repr(sentence).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def save(
    path: Path, features: Sequence[Mapping[str, Any]], stats: Mapping[str, int] | None = None
) -> None:
    """Write features (dicts of int lists or scalars) and encoding counts as .npz, atomically."""
    arrays: dict[str, np.ndarray] = {"count": np.array(len(features))}
    for name, value in (stats or {}).items():
        arrays[f"stat.{name}"] = np.asarray(value)
    for name in features[0] if features else ():
        values = [f[name] for f in features]
        if isinstance(values[0], (list, tuple, np.ndarray)):
            lengths = np.array([len(v) for v in values], dtype=np.int64)
            flat = [x for v in values for x in v]
            arrays[f"ragged.{name}.values"] = np.asarray(flat)
            arrays[f"ragged.{name}.lengths"] = lengths
        else:
            arrays[f"scalar.{name}"] = np.asarray(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path, stats: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Features written by ``save``, as lists of dicts of Python lists and scalars; the encoding
    counts go into ``stats``."""
    with np.load(path, allow_pickle=False) as npz:
        count = int(npz["count"])
        columns: dict[str, list] = {}
        for name in npz.files:
            kind, _, rest = name.partition(".")
            if kind == "stat" and stats is not None:
                stats[rest] = npz[name].item()
            elif kind == "scalar":
                columns[rest] = npz[name].tolist()
            elif kind == "ragged" and rest.endswith(".values"):
                field = rest.removesuffix(".values")
                lengths = npz[f"ragged.{field}.lengths"]
                flat = npz[name].tolist()
                ends = np.cumsum(lengths).tolist()
                starts = [0, *ends[:-1]]
                columns[field] = [flat[a:b] for a, b in zip(starts, ends, strict=True)]
    return [{name: col[i] for name, col in columns.items()} for i in range(count)]


def encode_splits(
    cfg: DictConfig,
    task,
    sentences: Mapping[str, Sequence],
    tokenizer,
    label2id: Mapping[str, int],
    run=None,
    stats: Mapping[str, dict] | None = None,
) -> dict[str, list[dict]]:
    """``task.encode`` for every split, through the cache when ``data.tokenized_cache`` is on.

    ``stats[split]``, if given, receives the encoder's counts (cached with the features). Tags the
    run ``data.cache`` = ``hit`` (every split from the cache), ``miss`` (none),
    ``partial`` or ``off``, and logs ``tokenize_time_s``.
    """
    t0 = time.perf_counter()
    d = cfg.data
    max_length = d.max_length
    features: dict[str, list[dict]] = {}
    outcome: list[bool] = []
    folder = Path(d.tokenized_cache_dir).expanduser() if d.tokenized_cache_dir else default_dir()
    tokenizer_id = tokenizer_fingerprint(tokenizer) if d.tokenized_cache else ""
    for split, sents in sentences.items():
        counts = stats[split] if stats is not None else None
        extra = () if counts is None else (counts,)
        if not d.tokenized_cache:
            features[split] = task.encode(sents, tokenizer, label2id, max_length, *extra)
            continue
        path = folder / f"{key(sents, task.encode, tokenizer_id, label2id, max_length)}.npz"
        if path.is_file():
            try:
                features[split] = load(path, counts)
                outcome.append(True)
                continue
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
                # damaged (truncated, emptied, edited by hand): rebuild it
                log.warning("tokenised cache %s unreadable (%s); rebuilding it", path, exc)
        # the counts are cached too, so a hit reports what encoding found
        counts = {} if counts is None else counts
        features[split] = task.encode(sents, tokenizer, label2id, max_length, counts)
        outcome.append(False)
        try:
            save(path, features[split], counts)
        except OSError as exc:  # a read-only cache must not stop a run
            log.warning("could not write the tokenised cache %s: %s", path, exc)
    state = "off"
    if outcome:
        state = "hit" if all(outcome) else "miss" if not any(outcome) else "partial"
    if run is not None:
        run.tags({"data.cache": state})
        run.metrics({"tokenize_time_s": time.perf_counter() - t0})
    log.info(
        "tokenised %s (cache: %s) in %.2f s", ", ".join(sentences), state, time.perf_counter() - t0
    )
    return features
