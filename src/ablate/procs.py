"""Is a recorded process still running, and is it still the one that was recorded?

A pid alone is not enough: after a crash the kernel may give it to another process. Linux's
/proc/<pid>/stat also holds the process's start time, which tells the two apart; elsewhere only
the pid is checked.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None when there is none."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), or None (no such process, no /proc)."""
    fields = _stat(pid)
    return fields[19] if fields else None


def _reap(pid: int) -> bool | None:
    """Reap ``pid`` if it is our own exited child: True when reaped, False when our child cannot
    be reaped (yet), None when it is not our child."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has exited; our own exited child is reaped)."""
    if _reap(pid):
        return False
    fields = _stat(pid)
    if fields is not None:
        if fields[0] != "Z":
            return True
        # A zombie. Our own child is reaped now, or the caller would find its pid taken; one
        # that cannot be reaped yet is a thread-group leader whose other threads still run
        # (the mlflow server's exit, seen in CI), so it still counts as running. Another
        # process's zombie has exited: only its parent can reap it.
        return _reap(pid) is False
    if (_PROC / "self" / "stat").exists():  # Linux: no such process
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def same(pid: int, recorded_start: str | None) -> bool:
    """Whether ``pid`` runs and is the process recorded with start time ``recorded_start``
    (None: not recorded, or no /proc then: the pid alone decides)."""
    if not alive(pid):
        return False
    now = started(pid)
    return recorded_start is None or now is None or now == recorded_start
