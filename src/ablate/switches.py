"""Switches: config keys that choose how a run computes, not what it trains, each declared once
with its default per device and what it does to results.

The config schema (``ablate.config``) adds a field per declared switch of its group; a run's
identity, the report's comparability, ``--help`` and the config reference derive from the same
declarations. The core declares the measurement and tokenised-cache switches below; the speed
plugins (``ablate.speed``) and extensions declare theirs with ``register``. Pure data: importing it
loads nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# What a switch does to a run's numbers.
IDENTICAL = "identical"  # the same numbers to the last digit (tested); not part of a run's identity
SAME_MATH = "same math"  # the same computation up to float rounding or other draws of the same
# random masks (seed noise): part of the identity, yet runs differing in it are comparable
CHANGES = "changes"  # another computation: runs differing in it are different settings
RESULTS = (IDENTICAL, SAME_MATH, CHANGES)
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Switch:
    """One speed switch.

    ``default`` is the config value; ``None`` means "by device", and ``devices`` says what each
    device then gets (also what a concrete default amounts to there). ``added`` marks keys added
    after run identities were first recorded: such a key counts in a run's identity only when set
    away from its default, so runs made before it existed keep their identity.
    """

    key: str
    type: Any
    default: Any
    devices: dict[str, Any]
    results: str
    doc: str
    plugin: str
    choices: tuple[str, ...] = ()
    added: bool = False
    # Hashed into identities since they were introduced although its results are identical:
    # dropping it now would change every earlier run's identity.
    legacy_identity: bool = False

    @property
    def group(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]

    @property
    def in_identity(self) -> bool:
        """Whether the key is hashed into a run's identity (see ``added`` for new keys)."""
        return self.results != IDENTICAL or self.legacy_identity

    @property
    def comparable(self) -> bool:
        """Whether runs that differ only in this key may be compared (averaged as seeds)."""
        return self.results != CHANGES

    def resolve(self, value: Any, device: str) -> Any:
        """The value in effect on ``device`` (``cpu``/``cuda``) for config value ``value``."""
        return self.devices[device] if value is None else value


CORE = "core"  # ``Switch.plugin`` of a switch that ablate's training implements itself

SWITCHES: list[Switch] = [
    Switch(
        "trainer.measure_flops",
        bool,
        False,
        {"cpu": False, "cuda": False},
        IDENTICAL,
        "also log the executed training FLOPs per epoch and per second (every run logs its total, "
        "`train_flops`)",
        plugin=CORE,
        legacy_identity=True,
    ),
    Switch(
        "data.tokenized_cache",
        bool,
        True,
        {"cpu": True, "cuda": True},
        IDENTICAL,
        "split files kept as read (joblib, in `read/`) and tokenised (Hugging Face datasets "
        "cache files), reused by the next job of a sweep (tag `data.cache`: hit, miss)",
        plugin=CORE,
    ),
    Switch(
        "data.tokenized_cache_dir",
        str | None,
        None,
        {"cpu": "~/.cache/ablate/tokenized", "cuda": "~/.cache/ablate/tokenized"},
        IDENTICAL,
        "folder of the tokenised cache; null = <user cache>/ablate/tokenized",
        plugin=CORE,
    ),
]


BY_KEY: dict[str, Switch] = {s.key: s for s in SWITCHES}


def register(switch: Switch) -> Switch:
    """Declare ``switch`` (the speed plugins', an extension's); its key must be new and live in the
    ``trainer`` or ``data`` group. Returns it."""
    if switch.key in BY_KEY:
        raise ValueError(f"speed switch {switch.key!r} is declared already")
    if switch.group not in ("trainer", "data") or switch.results not in RESULTS:
        raise ValueError(f"speed switch {switch.key!r}: group trainer/data, results in {RESULTS}")
    SWITCHES.append(switch)
    BY_KEY[switch.key] = switch
    return switch


def in_group(group: str) -> list[Switch]:
    """The switches whose key lives in config group ``group`` (``trainer``, ``data``)."""
    return [s for s in SWITCHES if s.group == group]
