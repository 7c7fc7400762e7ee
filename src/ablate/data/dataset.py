"""Tokenised splits as Hugging Face ``datasets``, reused across the jobs of a sweep
(``data.tokenized_cache``).

Each split's sentences become a ``Dataset``, tokenised by the task's encoder through
``Dataset.map`` under an explicit fingerprint of everything the features depend on: the split
file's sha256 and the sentences as read (so ``lowercase`` and any slicing), ``max_length``, the
label inventory, the tokenizer's full definition, the encoder's source and the versions of
transformers, tokenizers and datasets. With the cache on, ``map`` writes the result as
``<fingerprint>.arrow`` in the cache folder (to a temporary file, then renamed, so parallel jobs
never read half a file) and the next job with the same fingerprint reads it instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from ablate.config import user_cache
from ablate.data.sentences import Sentence
from ablate.quiet import quieted

log = logging.getLogger(__name__)

FORMAT = 2  # bump when the stored layout changes (1: the .npz files before datasets)
STAT = "stat."  # columns holding the encoder's counts, not features
VERSIONED = ("transformers", "tokenizers", "datasets")


def default_dir() -> Path:
    """``<user cache>/ablate/tokenized`` (e.g. ``~/.cache/ablate/tokenized``)."""
    return user_cache() / "tokenized"


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


def code_version(fn) -> str:
    """sha256 of the source file that defines ``fn`` (its repr where there is none)."""
    try:
        source = Path(inspect.getsourcefile(fn)).read_bytes()
    except (TypeError, OSError):
        source = repr(fn).encode()
    return hashlib.sha256(source).hexdigest()


def fingerprint(
    sentences: Sequence[Sentence],
    encode: Callable,
    tokenizer_id: str,
    label2id: Mapping[str, int],
    max_length: int,
    source: str = "",
) -> str:
    """The fingerprint of one split's features: sha256 over its sentences and everything encoding
    depends on (``tokenizer_id``: ``tokenizer_fingerprint``; ``source``: the file's sha256)."""
    digest = hashlib.sha256()
    header = {
        "format": FORMAT,
        "source": source,
        "encoder": f"{encode.__module__}.{encode.__qualname__}",
        "encoder_source": code_version(encode),
        "tokenizer": tokenizer_id,
        "labels": sorted(label2id.items(), key=lambda kv: kv[1]),
        "max_length": max_length,
        "n": len(sentences),
        # word_ids(), pre-split tokenisation and the file layout come from these
        "versions": [importlib.metadata.version(p) for p in VERSIONED],
    }
    digest.update(json.dumps(header, sort_keys=True).encode())
    for sentence in sentences:  # frozen dataclasses of tuples: a deterministic repr
        digest.update(repr((sentence.words, sentence.labels)).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _encode_batch(batch: dict, encode: Callable, tokenizer, label2id, max_length: int) -> dict:
    """``Dataset.map`` function: a batch of sentences as feature columns."""
    sentences = [
        Sentence(tuple(w), tuple(lab))
        for w, lab in zip(batch["words"], batch["labels"], strict=True)
    ]
    stats: dict[str, int] = {}
    features = encode(sentences, tokenizer, label2id, max_length, stats)
    columns = {name: [f[name] for f in features] for name in (features[0] if features else ())}
    # The batch's counts ride on its first row (zeros elsewhere), so they are cached with the
    # features and their sum over the split is the split's count.
    for name, value in stats.items() if features else ():
        columns[STAT + name] = [value] + [0] * (len(features) - 1)
    return columns


@dataclass
class Encoded:
    """Features per split, the encoder's counts per split, and whether the cache served them
    (``cache``: ``hit``, ``miss``, ``partial`` or ``off``)."""

    features: dict[str, list[dict]]
    stats: dict[str, dict[str, int]]
    cache: str
    seconds: float


def encode_splits(
    sentences: Mapping[str, Sequence[Sentence]],
    encode: Callable,
    tokenizer,
    label2id: Mapping[str, int],
    max_length: int,
    cache_dir: Path | None,
    sources: Mapping[str, str] | None = None,
) -> Encoded:
    """``encode`` every split through ``Dataset.map``; with ``cache_dir``, through its cache.

    ``sources``: each split's file sha256, part of the fingerprint.
    """
    from datasets import Dataset

    t0 = time.perf_counter()
    tokenizer_id = tokenizer_fingerprint(tokenizer)
    features, stats, served = {}, {}, []
    for split, sents in sentences.items():
        table = Dataset.from_dict(
            {"words": [list(s.words) for s in sents], "labels": [list(s.labels) for s in sents]}
        )
        fp = fingerprint(
            sents, encode, tokenizer_id, label2id, max_length, (sources or {}).get(split, "")
        )
        # Given, the fingerprint spares datasets hashing the tokenizer through dill.
        kwargs: dict = {"keep_in_memory": True, "new_fingerprint": fp}
        if cache_dir is not None:
            path = Path(cache_dir).expanduser() / f"{fp}.arrow"
            served.append(path.is_file())
            path.parent.mkdir(parents=True, exist_ok=True)
            kwargs = {"cache_file_name": str(path), "new_fingerprint": fp}
        arguments = {
            "batched": True,
            "batch_size": None,  # the whole split at once, as the tokenizer batches best
            "remove_columns": table.column_names,
            "fn_kwargs": {
                "encode": encode,
                "tokenizer": tokenizer,
                "label2id": dict(label2id),
                "max_length": max_length,
            },
            "load_from_cache_file": True,
            **kwargs,
        }
        # datasets draws a bar per map; tokenising a split takes a second or less
        with quieted(bars=("datasets",), terminal_bars=False):
            try:
                encoded = table.map(_encode_batch, **arguments)
            except (OSError, ValueError, pa.ArrowException) as exc:
                if cache_dir is None:
                    raise
                # damaged (truncated, emptied, edited by hand): rebuilt
                log.warning("tokenised cache %s unreadable (%s); rebuilding it", path, exc)
                path.unlink(missing_ok=True)
                served[-1] = False
                encoded = table.map(_encode_batch, **arguments)
        counts = [c for c in encoded.column_names if c.startswith(STAT)]
        stats[split] = {c.removeprefix(STAT): int(sum(encoded[c])) for c in counts}
        features[split] = encoded.remove_columns(counts).to_list()
    state = "off"
    if cache_dir is not None:
        state = "hit" if all(served) else "miss" if not any(served) else "partial"
    seconds = time.perf_counter() - t0
    log.info("tokenised %s (cache: %s) in %.2f s", ", ".join(sentences), state, seconds)
    return Encoded(features, stats, state, seconds)
