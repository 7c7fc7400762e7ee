"""RUNNING runs whose process died: a SIGKILL or a preemption leaves no other trace."""

from __future__ import annotations

import json
import socket
import time

from mlflow.tracking import MlflowClient

from ablate.tracking import procs


def mark_stale_runs(client: MlflowClient, experiment_id: str, stale_after_s: float) -> list[str]:
    """Mark KILLED the RUNNING runs whose process died; return their ids.

    Dead means: started on this host by a process that no longer exists (or whose pid another
    process now has: the start time differs), or (any host) no heartbeat for ``stale_after_s``
    seconds. A SIGKILL or a preemption leaves no other trace. A run whose very process is still
    alive on this host is never marked, however long it has been quiet (a long evaluation).
    """
    host, now, killed = socket.gethostname(), time.time(), []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'"):
        tags = run.data.tags
        recorded = _process(tags)
        pid = int(recorded.get("pid") or 0)
        beat = float(tags.get("ablate.heartbeat", run.info.start_time / 1000))
        started = recorded.get("started")
        here = recorded.get("host") == host and pid
        if here and not procs.same(pid, started):
            reason = f"process {pid} on {host} is gone"
        elif here and started is not None:
            continue  # that very process runs (same pid and start time)
        elif now - beat > stale_after_s:
            reason = f"no heartbeat for {(now - beat) / 60:.0f} min"
        else:
            continue
        client.set_tag(run.info.run_id, "ablate.killed_reason", reason)
        client.set_terminated(run.info.run_id, status="KILLED")
        killed.append(run.info.run_id)
    return killed


def _process(tags: dict[str, str]) -> dict:
    """The process a run recorded (``ablate.process``; runs of earlier versions: three tags)."""
    if "ablate.process" in tags:
        return json.loads(tags["ablate.process"])
    return {
        "host": tags.get("host"),
        "pid": tags.get("ablate.pid"),
        "started": tags.get("ablate.pid_started"),
    }
