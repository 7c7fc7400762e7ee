"""Is a recorded process still running, and is it still the one that was recorded?

A pid alone is not enough: after a crash the kernel may give it to another process. The
process's start time (psutil's ``create_time``) tells the two apart.
"""

from __future__ import annotations

import os

import psutil


def started(pid: int) -> str | None:
    """The process's start time (seconds since the epoch, as text), or None (no such process)."""
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


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
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # another user's
    if status != psutil.STATUS_ZOMBIE:
        return True
    # A zombie. Our own child is reaped now, or the caller would find its pid taken; one that
    # cannot be reaped yet is a thread-group leader whose other threads still run (the mlflow
    # server's exit, seen in CI), so it still counts as running. Another process's zombie has
    # exited: only its parent can reap it.
    return _reap(pid) is False


def same(pid: int, recorded_start: str | None) -> bool:
    """Whether ``pid`` runs and is the process recorded with start time ``recorded_start``
    (None: not recorded: the pid alone decides)."""
    if not alive(pid):
        return False
    now = started(pid)
    return recorded_start is None or now is None or now == recorded_start
