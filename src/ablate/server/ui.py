"""``make ui``: MLflow's UI on the project's store, with the address of each experiment's runs.

The addresses open MLflow's model-training pages in the task's shared view
(``ablate.tracking.ui_links``, which a run also prints its own page with).

``make ui`` checks its port before it prints anything, and records where it serves a sqlite
store (``<store>.ui.json``, beside it), so a run prints the address of the UI that is up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys

from ablate.config import default_tracking_uri
from ablate.errors import AblateError
from ablate.tracking import procs
from ablate.tracking.store import absent
from ablate.tracking.ui_links import (
    HOST,
    PORT,
    TRAINING_VIEW,
    VIEW_TAG,
    address,
    record_file,
    serving,
    view_key,
)

# MLflow's job execution (GenAI jobs: prompt optimisation, scorers, trace roll-ups) starts a job
# runner and 7 huey consumers of ~240 MB each with every server; ablate's runs use none of it.
# Off unless the environment turns it on.
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
# MLflow's server imports starlette's deprecated WSGI middleware: each of its workers warned once,
# four two-line warnings under the addresses the user reads from this console
QUIET = {"PYTHONWARNINGS": "ignore:starlette.middleware.wsgi is deprecated:UserWarning"}


def experiments(uri: str) -> list[tuple[str, str, list[str]]]:
    """(name, id, its ablate views) of the store's experiments that hold runs, newest first;
    none for a store that does not exist yet."""
    if absent(uri):
        return []
    from mlflow.tracking import MlflowClient

    found = MlflowClient(tracking_uri=uri).search_experiments(order_by=["last_update_time DESC"])
    mine = VIEW_TAG + view_key("")
    return [
        (
            e.name,
            e.experiment_id,
            sorted(t.removeprefix(VIEW_TAG) for t in e.tags if t.startswith(mine)),
        )
        for e in found
        if e.name != "Default"
    ]


def _holder(port: int) -> str:
    """What listens on ``port``, as `` (pid N: command)``, when the system says."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                proc = psutil.Process(conn.pid)
                # a server's worker listens: name the command that started it (it names the port)
                while (up := proc.parent()) is not None and str(port) in " ".join(up.cmdline()):
                    proc = up
                command = " ".join(" ".join(proc.cmdline()).split())  # on one line
                return f" (pid {proc.pid}: {command[:160]})"
    except (psutil.Error, OSError):
        pass
    return ""


def check_port(uri: str, host: str, port: int) -> None:
    """One error, before anything is printed or started, when ``host:port`` is taken."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((host, port))
            return
        except OSError as exc:
            why = exc.strerror or str(exc)
    base = serving(uri)
    if base == f"http://{host}:{port}":
        raise AblateError(f"make ui already serves {uri} at {base}/#/?{TRAINING_VIEW}")
    raise AblateError(
        f"make ui: {host}:{port} is taken ({why}){_holder(port)}: stop it, or choose another "
        f"port: make ui PORT={port + 1}"
    )


def main(argv: list[str] | None = None) -> None:
    """Print where each experiment's runs are, then run ``mlflow ui`` in this process."""
    parser = argparse.ArgumentParser(prog="python -m ablate.server.ui", description=__doc__)
    parser.add_argument("--uri", default=default_tracking_uri(), help="the MLflow store")
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=int(PORT))
    args = parser.parse_args(argv)
    try:
        check_port(args.uri, args.host, args.port)
    except AblateError as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    base = f"http://{args.host}:{args.port}"
    found = experiments(args.uri)
    print(f"MLflow UI on {args.uri}: {base}/#/?{TRAINING_VIEW}")
    for name, experiment_id, views in found:
        for key in views or [None]:
            task = f" ({key.removeprefix(view_key(''))} runs)" if len(views) > 1 else ""
            print(f"  experiment {name!r}{task}: {address(base, experiment_id, view=key)}")
    if not found:
        print("  no runs yet: `make run` trains one")
    sys.stdout.flush()
    if (path := record_file(args.uri)) is not None:
        # this process becomes the UI (exec keeps its pid): a run reads where it serves
        record = {"base": base, "pid": os.getpid(), "started": procs.started(os.getpid())}
        with contextlib.suppress(OSError):  # a store's folder MLflow has yet to make
            path.write_text(json.dumps(record) + "\n")
    command = ["mlflow", "ui", "--backend-store-uri", args.uri, "--host", args.host]
    for key, value in {**NO_JOBS, **QUIET}.items():
        os.environ.setdefault(key, value)
    os.execvp(sys.executable, [sys.executable, "-m", *command, "--port", str(args.port)])


if __name__ == "__main__":
    main()
