"""Freeze keys: the ``freeze`` config keys the strategies read, each declared once (type, default,
doc, the values it allows) by the first strategy that reads it and named by the others.

The strategies declare theirs when they register (``ablate.strategies.register``); the config
schema (``ablate.config``) adds a field per declared key, its doc naming the strategies that read
it, so no list of keys or of their readers is kept anywhere else. Pure data: importing it loads
nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Key:
    """One ``freeze`` key. ``allowed``: a test of its value and the allowed values in words
    (checked before the strategy runs). ``added``: added after run identities were first
    recorded, hashed only when set away from its default (``ablate.config.key``)."""

    name: str
    type: Any
    default: Any
    doc: str
    allowed: tuple[Callable[[Any], bool], str] | None = None
    added: bool = False


CORE = ("name", "strategy")  # the keys of every option (``ablate.config.FreezeCore``)
KEYS: dict[str, Key] = {}  # in declaration order: the schema's and the docs' order
READERS: dict[str, list[str]] = {}  # key name -> the strategies that read it


def declare(strategy: str, keys: Iterable[Key | str]) -> tuple[str, ...]:
    """Record that ``strategy`` reads ``keys``: a ``Key`` declares it (once: a second, different
    declaration of the same name is refused), a name refers to one declared already. Returns
    their names."""
    keys = tuple(keys)
    names = [k if isinstance(k, str) else k.name for k in keys]
    for k, name in zip(keys, names, strict=True):  # all checked before any is recorded
        if name in CORE:
            raise ValueError(f"strategy {strategy!r}: freeze.{name} is every strategy's already")
        if isinstance(k, Key) and KEYS.get(name, k) != k:
            raise ValueError(f"freeze.{name}: declared twice, differently ({KEYS[name]}, {k})")
        if isinstance(k, str) and name not in KEYS:
            raise ValueError(f"strategy {strategy!r}: freeze.{name} is not declared (a Key)")
    for k, name in zip(keys, names, strict=True):
        KEYS.setdefault(name, k)
        if strategy not in READERS.setdefault(name, []):
            READERS[name].append(strategy)
    return tuple(names)


def doc(name: str) -> str:
    """The key's doc, led by the strategies that read it."""
    return f"{', '.join(READERS.get(name, []))}: {KEYS[name].doc}"
