"""``make ui``: MLflow's UI on the project's store, with the address of each experiment's runs.

MLflow's UI (3.x) opens every experiment on its GenAI pages unless the address asks for model
training (``?workflowType=machine_learning``) or the browser remembers that choice: the
addresses printed here, and the ones a run prints when it ends, ask for it.

MLflow's runs table opens with no metric column (they hide behind "Columns"). Each run's
experiment holds a shared view (the tag ``mlflow.sharedViewState.<key>``, what the UI's own
"Share" writes; ``?viewStateShareKey=<key>`` opens it) with the task's primary metric, best on dev
first, and the addresses of an experiment's runs open it.

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
from pathlib import Path

from ablate.config import default_tracking_uri
from ablate.errors import AblateError

TRAINING_VIEW = "workflowType=machine_learning"
# MLflow's job execution (GenAI jobs: prompt optimisation, scorers, trace roll-ups) starts a job
# runner and 7 huey consumers of ~240 MB each with every server; ablate's runs use none of it.
# Off unless the environment turns it on.
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
HOST, PORT = "127.0.0.1", "5000"  # make ui's (the Makefile's PORT)
RECORD = ".ui.json"  # beside a sqlite store: the make ui serving it


VIEW_TAG = "mlflow.sharedViewState."  # + its key: the view the UI opens with viewStateShareKey


def view_key(task: str) -> str:
    """The shared view of a task's runs."""
    return f"ablate-{task}"


def view(primary: str) -> str:
    """The runs table's columns and order for a task whose primary metric is ``primary``."""
    columns = [f"best_dev_{primary}", f"test_{primary}", "trainable_pct"]
    return json.dumps({
        "selectedColumns": [f"metrics.`{c}`" for c in columns] + ["attributes.`Models`"],
        "orderByKey": f"metrics.`best_dev_{primary}`", "orderByAsc": False,
    })  # fmt: skip


def set_view(client, experiment_id: str, task: str) -> None:
    """Give the experiment the shared view of ``task``'s runs, unless it holds that one."""
    from ablate import tasks

    tag, value = VIEW_TAG + view_key(task), view(tasks.get(task).primary_metric)
    if client.get_experiment(experiment_id).tags.get(tag) != value:
        client.set_experiment_tag(experiment_id, tag, value)


def address(
    base: str, experiment_id: str, run_id: str | None = None, view: str | None = None
) -> str:
    """The UI's page of an experiment's runs (in the shared view ``view``, if given), or of one
    run, in its model-training view."""
    page = f"experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    shared = f"viewStateShareKey={view}&" if view and not run_id else ""
    return f"{base.rstrip('/')}/#/{page}?{shared}{TRAINING_VIEW}"


def experiments(uri: str) -> list[tuple[str, str, list[str]]]:
    """(name, id, its ablate views) of the store's experiments that hold runs, newest first;
    none for a store that does not exist yet."""
    if uri.startswith("sqlite:///") and not os.path.isfile(uri.removeprefix("sqlite:///")):
        return []
    from mlflow.tracking import MlflowClient

    found = MlflowClient(tracking_uri=uri).search_experiments(order_by=["last_update_time DESC"])
    mine = VIEW_TAG + view_key("")
    return [
        (e.name, e.experiment_id,
         sorted(t.removeprefix(VIEW_TAG) for t in e.tags if t.startswith(mine)))
        for e in found if e.name != "Default"
    ]  # fmt: skip


def record_file(uri: str) -> Path | None:
    """Where ``make ui`` records the address it serves a sqlite store at; None for a server."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///") + RECORD)


def serving(uri: str) -> str | None:
    """The address of the ``make ui`` serving ``uri`` now (its recorded process still runs), or
    None."""
    from ablate.tracking import procs

    path = record_file(uri)
    try:
        found = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if not found or not procs.same(found["pid"], found.get("started")):
        return None
    return found["base"]


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
    parser = argparse.ArgumentParser(prog="python -m ablate.tracking.ui", description=__doc__)
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
        from ablate.tracking import procs

        # this process becomes the UI (exec keeps its pid): a run reads where it serves
        record = {"base": base, "pid": os.getpid(), "started": procs.started(os.getpid())}
        with contextlib.suppress(OSError):  # a store's folder MLflow has yet to make
            path.write_text(json.dumps(record) + "\n")
    command = ["mlflow", "ui", "--backend-store-uri", args.uri, "--host", args.host]
    for key, value in NO_JOBS.items():
        os.environ.setdefault(key, value)
    os.execvp(sys.executable, [sys.executable, "-m", *command, "--port", str(args.port)])


if __name__ == "__main__":
    main()
