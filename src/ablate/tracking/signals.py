"""Stop signals while a run is open: SLURM, Kubernetes, systemd and docker stop a job with
SIGTERM (SLURM also USR1/USR2 as `--signal` asks); the run ends KILLED with its last epoch
checkpoint, then the signal goes on to what was there before (submitit's requeue). A sweep's own
process passes the signal on to the jobs it started (``pass_on``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

# What schedulers send to stop a job: SLURM (scancel, time limit, preemption: TERM, or USR1/USR2
# as `--signal` asks), Kubernetes, systemd and docker (TERM). Ctrl-C stays a KeyboardInterrupt.
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, name)
)


class Interrupted(BaseException):
    """A stop signal, raised where the job was so that the run ends KILLED with its last epoch
    checkpoint (a BaseException, as KeyboardInterrupt: nothing may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stop_signals() -> Iterator[dict[int, Any]]:
    """Raise ``Interrupted`` on a stop signal while the run is open; yields the handlers that
    were installed before (submitit's requeue, say), to call once the run is closed."""
    if threading.current_thread() is not threading.main_thread():
        yield {}
        return

    def interrupt(signum, frame):
        _ignore_more()  # a second TERM (the scheduler's and the sweep's) must not cut the close
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield previous
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def after_stop(signum: int, previous: dict[int, Any]) -> None:
    """The run is closed KILLED: hand the signal to what was there before (submitit checkpoints
    and requeues the job), else end the process as the signal would have."""
    handler = previous.get(signum)
    if callable(handler):
        handler(signum, None)
    if multiprocessing.parent_process() is not None:
        # a pool's worker (a joblib sweep's): the pool would catch SystemExit and start its next job
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)
    raise SystemExit(128 + signum)


def _ignore_more() -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def _ignores(pid: int, signum: int) -> bool:
    """Whether a process ignores ``signum`` (joblib's resource tracker ignores TERM), read from
    Linux's /proc; elsewhere taken as no."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return False
    mask = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigIgn:")), "0")
    return bool(int(mask, 16) >> (signum - 1) & 1)


def pass_on(on_stop: Callable[[int], None] | None = None, grace_s: float = 60) -> None:
    """In a sweep's own process: on a stop signal, send it on to the processes this one started
    (a joblib sweep's workers, an lr study's trial), wait up to ``grace_s`` for them
    to close their runs KILLED and exit, call ``on_stop(signum)``, then exit as the signal asks.
    Without it the process dies at once, and its workers train on, writing to the store."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum, frame):
        import psutil

        _ignore_more()
        children = [c for c in psutil.Process().children() if not _ignores(c.pid, signum)]
        for child in children:
            with suppress(psutil.NoSuchProcess):
                child.send_signal(signum)
        psutil.wait_procs(children, timeout=grace_s)
        if on_stop is not None:
            on_stop(signum)
        raise SystemExit(128 + signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
