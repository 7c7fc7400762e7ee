"""The job log without the libraries' repeats: loggers raised to a level and progress bars off,
for the length of a block."""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence


@contextlib.contextmanager
def quieted(
    loggers: Mapping[str, int] | None = None, bars: Sequence[str] = (), terminal_bars: bool = True
) -> Iterator[None]:
    """While the block runs, each of ``loggers`` (name -> level) shows records of its level and
    above only, and the progress bars of the libraries in ``bars`` (``transformers``,
    ``datasets``: their ``utils.logging`` switches) are off; with ``terminal_bars``, bars stay
    where stderr is a terminal (they are for people, not job logs)."""
    held = [(logging.getLogger(name), level) for name, level in (loggers or {}).items()]
    before = [logger.level for logger, _ in held]
    for logger, level in held:
        logger.setLevel(level)
    switched = []
    if not (terminal_bars and sys.stderr.isatty()):
        for library in bars:
            switch = importlib.import_module(f"{library}.utils.logging")
            if switch.is_progress_bar_enabled():
                switch.disable_progress_bar()
                switched.append(switch)
    try:
        yield
    finally:
        for (logger, _), level in zip(held, before, strict=True):
            logger.setLevel(level)
        for switch in switched:
            switch.enable_progress_bar()
