"""The speed plugins, in the order their hooks run (``ablate.speed.plugin``): numerics first
(they decide TrainingArguments), then what wraps the model (the prefix cache before the
embedding rows it excludes), batching, evaluation, dropout (it needs the Trainer's device) and
the meter last (its collator wrapper outermost, so the batching mixin finds its counts)."""

from __future__ import annotations

from ablate.speed.cache_frozen import CacheFrozen
from ablate.speed.dropout import Dropout
from ablate.speed.embedding_rows import EmbeddingRows
from ablate.speed.evaluation import SortedEval
from ablate.speed.grouping import LengthGrouping
from ablate.speed.meter import Meter
from ablate.speed.plugin import Plugin
from ablate.speed.precision import Precision


def default_plugins() -> list[Plugin]:
    """A fresh instance of every plugin, in hook order."""
    return [
        Precision(), CacheFrozen(), EmbeddingRows(), LengthGrouping(), SortedEval(), Dropout(),
        Meter(),
    ]  # fmt: skip


# Plugins added by extensions (docs/extending.md), run after the built-in ones.
EXTRA: list[type[Plugin]] = []


def register(plugin: type[Plugin]) -> type[Plugin]:
    """Add a plugin class; every run instantiates it after the built-in ones. Returns it."""
    EXTRA.append(plugin)
    return plugin


def active() -> list[Plugin]:
    """The plugins of one run, in hook order."""
    return [*default_plugins(), *(cls() for cls in EXTRA)]
