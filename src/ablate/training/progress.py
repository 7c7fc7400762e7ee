"""Training's progress for a person at a terminal: the Trainer's bars, with the job log's lines
written above them, and none of the raw dicts the Trainer prints at each log."""

from __future__ import annotations

import contextlib
import os
import sys

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import ProgressCallback
from transformers.trainer_utils import has_length

FALLBACK = os.terminal_size((80, 24))  # columns, lines


def _size() -> dict:
    """tqdm's size for stderr: the terminal's own, or where it reports none (a bare
    pseudo-terminal: 0 x 0) a fixed one, as tqdm's own bars would print nothing there."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        size = os.terminal_size((0, 0))
    if size.columns and size.lines:
        return {"dynamic_ncols": True}
    return {"ncols": size.columns or FALLBACK.columns, "nrows": size.lines or FALLBACK.lines}


class TerminalProgress(ProgressCallback):
    """The Trainer's progress bars (its training steps, each evaluation) without the log dicts
    it writes above them: the job log's one line per epoch (``EpochLogger``) says what they
    hold."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = tqdm(total=state.max_steps, **_size())
        self.current_step = 0

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if state.is_world_process_zero and has_length(eval_dataloader):
            if self.prediction_bar is None:
                leave = self.training_bar is None  # the final evaluations' bars stay
                total = len(eval_dataloader)
                self.prediction_bar = tqdm(total=total, leave=leave, **_size())
            self.prediction_bar.update(1)

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def log_above_bars(trainer) -> contextlib.AbstractContextManager:
    """While ``trainer`` shows bars (``TerminalProgress``), the console's log lines are written
    above them, not into them."""
    if any(isinstance(c, TerminalProgress) for c in trainer.callback_handler.callbacks):
        return logging_redirect_tqdm(tqdm_class=tqdm)
    return contextlib.nullcontext()
