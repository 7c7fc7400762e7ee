"""Training's progress on the console of a real short run: tqdm bars for a person at a terminal
(a real pseudo-terminal), one plain line per epoch otherwise, and never the Trainer's raw log
dicts."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys

from helpers.data import ROOT
from helpers.runs import run_cli, slice_overrides
from helpers.store import new_store

RAW = ("{'loss'", "'eval_loss'", "'train_runtime'")  # what the Trainer prints of its logs
EPOCHS = ("epoch 1/2: dev accuracy", "epoch 2/2: dev accuracy")


def at_a_terminal(*args: str, timeout: float = 600) -> tuple[int, str]:
    """``python -m ablate.train ARGS`` with a pseudo-terminal as its stdin, stdout and stderr
    (a bare one, as ``os.openpty`` makes it: it reports no size); its exit code and output."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", *args], cwd=ROOT, env=env,
        stdin=terminal, stdout=terminal, stderr=terminal,
    )  # fmt: skip
    os.close(terminal)
    out = b""
    try:
        while select.select([controller], [], [], timeout)[0]:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the run, the terminal's last writer, has exited
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(controller)
    return proc.wait(timeout=60), out.decode("utf-8", errors="replace")


def test_bars_at_a_terminal_and_plain_epoch_lines_elsewhere(slice_root, tmp_path):
    store = new_store(tmp_path)
    given = [*slice_overrides(slice_root, store, tmp_path), "trainer.keep_model=false"]
    code, shown = at_a_terminal(*given, f"hydra.run.dir={tmp_path / 'terminal'}")
    assert code == 0, shown[-3000:]
    # the training steps' bar, to its end: 120 sentences in batches of 16, 2 epochs
    assert re.search(r"100%\|█+\| 16/16 \[", shown), shown[-3000:]
    assert all(line in shown for line in EPOCHS)
    assert not [raw for raw in RAW if raw in shown], shown[-3000:]

    proc = run_cli(*given, f"hydra.run.dir={tmp_path / 'log'}")  # output to pipes: a job log
    logged = proc.stdout + proc.stderr
    assert proc.returncode == 0, logged[-3000:]
    assert all(line in logged for line in EPOCHS)
    assert "\r" not in logged and "it/s]" not in logged
    assert not [raw for raw in RAW if raw in logged], logged[-3000:]
