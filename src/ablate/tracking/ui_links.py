"""The UI's pages of an experiment's runs and of one run, the shared view they open, and the
``make ui`` (``ablate.server.ui``) that serves a sqlite store now: what a run prints when it ends
and sets on its experiment when it starts.

MLflow's UI (3.x) opens every experiment on its GenAI pages unless the address asks for model
training (``?workflowType=machine_learning``) or the browser remembers that choice: these
addresses ask for it.

MLflow's runs table opens with no metric column (they hide behind "Columns"). Each run's
experiment holds a shared view (the tag ``mlflow.sharedViewState.<key>``, what the UI's own
"Share" writes; ``?viewStateShareKey=<key>`` opens it) with the task's primary metric, best on dev
first, and the data, strategy, lr and seed of each run; the addresses of an experiment's runs
open it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ablate.tracking import procs

TRAINING_VIEW = "workflowType=machine_learning"
HOST, PORT = "127.0.0.1", "5000"  # make ui's (the Makefile's PORT)
RECORD = ".ui.json"  # beside a sqlite store: the make ui serving it
VIEW_TAG = "mlflow.sharedViewState."  # + its key: the view the UI opens with viewStateShareKey
# The params a comparison reads beside the metrics (run names are cut short in the table).
COMPARED = ("data.name", "freeze.name", "trainer.lr", "seed")


def view_key(task: str) -> str:
    """The shared view of a task's runs."""
    return f"ablate-{task}"


def view(primary: str) -> str:
    """The runs table's columns and order for a task whose primary metric is ``primary``."""
    columns = [f"best_dev_{primary}", f"test_{primary}", "trainable_pct"]
    return json.dumps(
        {
            "selectedColumns": [f"metrics.`{c}`" for c in columns]
            + [f"params.`{p}`" for p in COMPARED]
            + ["attributes.`Models`"],
            "orderByKey": f"metrics.`best_dev_{primary}`",
            "orderByAsc": False,
        }
    )


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


def record_file(uri: str) -> Path | None:
    """Where ``make ui`` records the address it serves a sqlite store at; None for a server."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///") + RECORD)


def serving(uri: str) -> str | None:
    """The address of the ``make ui`` serving ``uri`` now (its recorded process still runs), or
    None."""
    path = record_file(uri)
    try:
        found = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if not found or not procs.same(found["pid"], found.get("started")):
        return None
    return found["base"]


def where_to_browse(uri: str, experiment_id: str, run_id: str) -> str:
    """How to see a run in MLflow's UI: its page on a tracking server or on the ``make ui`` that
    serves this store now, else ``make ui`` (on ``$PORT``, as the Makefile) and the page it
    will be at."""
    if uri.startswith(("http://", "https://")):
        return f"open {address(uri, experiment_id, run_id)}"
    if (base := serving(uri)) is not None:  # the make ui that serves this store now
        return f"open {address(base, experiment_id, run_id)} (make ui serves this store)"
    port = os.environ.get("PORT", PORT)
    page = address(f"http://{HOST}:{port}", experiment_id, run_id)
    make = "make ui" if port == PORT else f"make ui PORT={port}"
    return f"browse it with: {make}, then {page}"
