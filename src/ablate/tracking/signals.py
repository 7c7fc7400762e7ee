"""Stop signals while a run is open: SLURM, Kubernetes, systemd and docker stop a job with
SIGTERM (SLURM also USR1/USR2 as `--signal` asks); the run ends KILLED with its last epoch
checkpoint, then the signal goes on to what was there before (submitit's requeue)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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
    raise SystemExit(128 + signum)
