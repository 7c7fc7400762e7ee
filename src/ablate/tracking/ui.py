"""``make ui``: MLflow's UI on the project's store, with the address of each experiment's runs.

MLflow's UI (3.x) opens every experiment on its GenAI pages unless the address asks for model
training (``?workflowType=machine_learning``) or the browser remembers that choice: the
addresses printed here, and the ones a run prints when it ends, ask for it.
"""

from __future__ import annotations

import argparse
import os
import sys

from ablate.config import default_tracking_uri

TRAINING_VIEW = "workflowType=machine_learning"
# MLflow's job execution (GenAI jobs: prompt optimisation, scorers, trace roll-ups) starts a job
# runner and 7 huey consumers of ~240 MB each with every server; ablate's runs use none of it.
# Off unless the environment turns it on.
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
HOST, PORT = "127.0.0.1", "5000"  # make ui's (the Makefile's PORT)


def address(base: str, experiment_id: str, run_id: str | None = None) -> str:
    """The UI's page of an experiment's runs, or of one run, in its model-training view."""
    page = f"experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}/#/{page}?{TRAINING_VIEW}"


def experiments(uri: str) -> list[tuple[str, str]]:
    """(name, id) of the store's experiments that hold runs, newest first; none for a store
    that does not exist yet."""
    if uri.startswith("sqlite:///") and not os.path.isfile(uri.removeprefix("sqlite:///")):
        return []
    from mlflow.tracking import MlflowClient

    found = MlflowClient(tracking_uri=uri).search_experiments(order_by=["last_update_time DESC"])
    return [(e.name, e.experiment_id) for e in found if e.name != "Default"]


def main(argv: list[str] | None = None) -> None:
    """Print where each experiment's runs are, then run ``mlflow ui`` in this process."""
    parser = argparse.ArgumentParser(prog="python -m ablate.tracking.ui", description=__doc__)
    parser.add_argument("--uri", default=default_tracking_uri(), help="the MLflow store")
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", default=PORT)
    args = parser.parse_args(argv)
    base = f"http://{args.host}:{args.port}"
    found = experiments(args.uri)
    print(f"MLflow UI on {args.uri}: {base}/#/?{TRAINING_VIEW}")
    for name, experiment_id in found:
        print(f"  experiment {name!r}: {address(base, experiment_id)}")
    if not found:
        print("  no runs yet: `make run` trains one")
    sys.stdout.flush()
    command = ["mlflow", "ui", "--backend-store-uri", args.uri, "--host", args.host]
    for key, value in NO_JOBS.items():
        os.environ.setdefault(key, value)
    os.execvp(sys.executable, [sys.executable, "-m", *command, "--port", str(args.port)])


if __name__ == "__main__":
    main()
