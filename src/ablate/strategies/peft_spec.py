"""What a peft method is (``Method``): the declaration ``peft_methods`` holds one of per method and
``peft_build`` builds from; torch-free, so the schema can read the keys without loading torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ablate import config
from ablate.freeze_keys import Key


@dataclass(frozen=True)
class Method:
    """A peft method: its config class, the ``freeze`` keys it reads (a ``Key`` declares one, a
    name reuses one another method declared), its config's arguments from those keys, what its
    targets are, and its freeze options in the report's order (none given: its name)."""

    name: str
    config: str  # the peft config class
    keys: tuple[Key | str, ...]
    options: Callable[[config.FreezeConfig], dict[str, Any]]
    targets: str = "attention"  # its default target_modules: a kind of anatomy.TARGETS
    peft_targets: str = "LORA"  # peft's table for other architectures
    kind: str = "Linear"  # what its targets must be: a torch.nn module class
    callbacks: Callable[[Any, config.FreezeConfig], list] = field(default=lambda model, freeze: [])
    freeze_options: tuple[str, ...] = ()

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(k if isinstance(k, str) else k.name for k in self.keys)
