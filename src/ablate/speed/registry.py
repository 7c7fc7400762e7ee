"""Every speed switch, declared once: its config key, default (per device), and what it does to
results.

The config schema (``ablate.config``), a run's identity (``ablate.tracking.identity``), the
report's comparability (``ablate.report.summary``) and the config reference (``docs/config.md``)
are all derived from ``SWITCHES``; the plugin that implements a switch is named by ``plugin``
(``ablate.speed.plugins``). Pure data: importing it loads nothing heavy.
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


SWITCHES: list[Switch] = [
    Switch(
        "trainer.length_grouping",
        str,
        "pack",
        {"cpu": "pack", "cuda": "pack"},
        CHANGES,
        "how training batches are laid out: `pack` each random batch into fewer rows "
        "(block-diagonal attention, positions restart per window: the padded batch's loss and "
        "gradients); `split` each into sub-batches of similar length (the same); `bucket` "
        "batches of similar length (other batches: changes results); `off` padded batches",
        plugin="length_grouping",
        choices=("pack", "split", "bucket", "off"),
    ),  # fmt: skip
    Switch(
        "trainer.round_shapes",
        bool | None,
        None,
        {"cpu": "with bf16", "cuda": False},
        SAME_MATH,
        "training batches in few shapes (widths in multiples of 32), since oneDNN builds its bf16 "
        "kernels per shape; null = on for bf16 on a CPU",
        plugin="length_grouping",
    ),  # fmt: skip
    Switch(
        "trainer.fused_adamw",
        bool,
        True,
        {"cpu": True, "cuda": True},
        SAME_MATH,
        "AdamW as one fused kernel (the same update)",
        plugin="precision",
    ),  # fmt: skip
    Switch(
        "trainer.bf16",
        bool | None,
        None,
        {"cpu": False, "cuda": True},
        CHANGES,
        "bf16 autocast; null = on for a GPU that supports it, off on CPU (true needs AVX-512 BF16 "
        "or AMX)",
        plugin="precision",
    ),  # fmt: skip
    Switch(
        "trainer.tf32",
        bool,
        True,
        {"cpu": False, "cuda": True},
        CHANGES,
        "TF32 matrix products (GPU only)",
        plugin="precision",
    ),  # fmt: skip
    Switch(
        "trainer.pin_memory",
        bool,
        True,
        {"cpu": False, "cuda": True},
        IDENTICAL,
        "pinned host memory for batches (GPU only)",
        plugin="precision",
    ),  # fmt: skip
    Switch(
        "trainer.attention_kernels",
        bool,
        True,
        {"cpu": False, "cuda": True},
        SAME_MATH,
        "scaled-dot-product attention without cuDNN's kernel on CUDA (it built an execution plan "
        "at every call: bf16 training 6x slower); false = torch's own choice",
        plugin="precision",
        added=True,
    ),  # fmt: skip
    Switch(
        "trainer.embedding_rows",
        bool,
        True,
        {"cpu": True, "cuda": True},
        SAME_MATH,
        "only the word-embedding rows the training data uses train, the others decay as AdamW "
        "would decay them (the same update, without a dense table gradient)",
        plugin="embedding_rows",
    ),  # fmt: skip
    Switch(
        "trainer.fast_dropout",
        bool,
        True,
        {"cpu": True, "cuda": False},
        SAME_MATH,
        "CPU dropout masks from int32 draws, 3x faster than bernoulli_ (the same distribution, "
        "other masks)",
        plugin="dropout",
    ),  # fmt: skip
    Switch(
        "trainer.sorted_eval",
        bool,
        True,
        {"cpu": True, "cuda": True},
        IDENTICAL,
        "dev/test sorted by length, cut into batches where padding plus a per-batch cost is "
        "least, under inference mode; predictions come back in dataset order",
        plugin="sorted_eval",
    ),  # fmt: skip
    Switch(
        "trainer.cache_frozen",
        bool,
        False,
        {"cpu": False, "cuda": False},
        CHANGES,
        "with the embeddings and blocks 0..k-1 frozen, their output is computed once per training "
        "window and training runs only blocks k.. (the prefix then has no dropout: changes "
        "results)",
        plugin="cache_frozen",
    ),  # fmt: skip
    Switch(
        "trainer.cache_frozen_eval",
        bool,
        True,
        {"cpu": True, "cuda": True},
        IDENTICAL,
        "the same for dev windows, kept from their first evaluation: later dev evaluations run "
        "only blocks k..",
        plugin="cache_frozen",
    ),  # fmt: skip
    Switch(
        "trainer.measure_flops",
        bool,
        False,
        {"cpu": False, "cuda": False},
        IDENTICAL,
        "also log the executed training FLOPs per epoch and per second (every run logs its total, "
        "`train_flops`)",
        plugin="meter",
        legacy_identity=True,
    ),  # fmt: skip
    Switch(
        "data.tokenized_cache",
        bool,
        True,
        {"cpu": True, "cuda": True},
        IDENTICAL,
        "tokenised splits kept as Hugging Face datasets cache files, reused by the next job of a "
        "sweep (tag `data.cache`: hit, miss)",
        plugin="tokenized_cache",
    ),  # fmt: skip
    Switch(
        "data.tokenized_cache_dir",
        str | None,
        None,
        {"cpu": "~/.cache/ablate/tokenized", "cuda": "~/.cache/ablate/tokenized"},
        IDENTICAL,
        "folder of the tokenised cache; null = <user cache>/ablate/tokenized",
        plugin="tokenized_cache",
    ),  # fmt: skip
]

BY_KEY: dict[str, Switch] = {s.key: s for s in SWITCHES}


def register(switch: Switch) -> Switch:
    """Add an extension's switch (``ablate.extensions``); its key must be new and live in the
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
