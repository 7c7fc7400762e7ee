"""Epoch checkpoints: where a run keeps them, the last complete one, resuming a KILLED run from
it, and removing them once the run finishes."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from ablate.errors import AblateError

log = logging.getLogger(__name__)
FOLDER_TAG = "ablate.checkpoint_dir"  # the run's tag naming its checkpoint folder


@contextlib.contextmanager
def folder() -> Iterator[str]:
    """The Trainer's output folder: the job's ``trainer/`` under Hydra, else a new temp folder.

    A run that fails before its first checkpoint leaves nothing in it to resume from, so the
    empty folder is removed; one with checkpoints stays for ``trainer.resume``.
    """
    path = job_path() or tempfile.mkdtemp(prefix="ablate-")
    try:
        yield path
    except BaseException:
        with contextlib.suppress(OSError):  # not empty (checkpoints) or never created
            Path(path).rmdir()
        raise


def job_path() -> str | None:
    """The checkpoint folder of this Hydra job (``<job folder>/trainer``); None outside Hydra."""
    if not HydraConfig.initialized():
        return None
    return str(Path(HydraConfig.get().runtime.output_dir) / "trainer")


def last_complete(path: str) -> str | None:
    """The newest ``checkpoint-N`` in ``path`` that was completely written, or None.

    A process killed while saving leaves a partial folder; the Trainer rotates the previous
    checkpoint out only after a save completes, so the previous one is still there.
    """
    steps = sorted(Path(path).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    for checkpoint in reversed(steps):
        # trainer_state.json is written last by the Trainer's save, and may be cut short itself
        if _state(checkpoint) is not None and any(checkpoint.glob("*.safetensors")):
            return str(checkpoint)
    return None


def _state(checkpoint: Path) -> dict | None:
    """The checkpoint's trainer state, or None where it is missing or was cut short."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "epoch" in state else None


def resumable(run) -> bool:
    """Whether the KILLED run ``run`` (an MLflow run) left an epoch checkpoint to resume from."""
    path = run.data.tags.get(FOLDER_TAG, "")
    return bool(path) and last_complete(path) is not None


def epochs_done(path: str) -> int:
    """The epochs the last complete checkpoint in ``path`` holds (0: none yet)."""
    last = last_complete(path) if path else None
    if last is None:
        return 0
    return round(_state(Path(last))["epoch"] or 0)


def resume_from(resumed) -> str | None:
    """The last epoch checkpoint of the KILLED run ``resumed`` (an MLflow run) continues, if any."""
    if resumed is None:
        return None
    path = resumed.data.tags.get(FOLDER_TAG, "")
    last = last_complete(path)
    if last is None:
        raise AblateError(
            f"cannot resume run {resumed.info.run_id}: no epoch checkpoint in {path!r} "
            f"(was it run with trainer.checkpoints=false, or killed in its first epoch?)"
        )
    log.info("resuming run %s from %s", resumed.info.run_id, last)
    return last


def remove(output_dir: str, resumed) -> None:
    """Remove the checkpoints of a finished run (and of the run it resumed): they exist only to
    resume a killed run."""
    folders = [output_dir]
    if resumed is not None:
        folders.append(resumed.data.tags.get(FOLDER_TAG, ""))
    for path in folders:
        for checkpoint in Path(path).glob("checkpoint-*") if path else ():
            shutil.rmtree(checkpoint, ignore_errors=True)
    with contextlib.suppress(OSError):  # the folder too, when nothing else is in it
        Path(output_dir).rmdir()
