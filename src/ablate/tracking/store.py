"""The MLflow store: checked reachable before any training, its schema and experiment created
once before the jobs of a sweep start (parallel jobs racing to create them crash, or put a
run in experiment "Default" without an error), and RUNNING runs whose process died marked KILLED."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ablate.errors import AblateError

# Offline machines: don't let MLflow try to phone home.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


# MLflow's UI opens an experiment on the page its kind names; untagged, it guesses and may open
# the GenAI traces overview. A user's own choice (set in the UI) is kept.
EXPERIMENT_KIND = "mlflow.experimentKind"
KIND = {EXPERIMENT_KIND: "custom_model_development"}


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail at once, not after an hour of training, if the store can't be used.

    MLflow's HTTP client retries with backoff for minutes; a short probe answers first, and
    tells a server that refuses the credentials from one that is not there.
    """
    if uri.startswith(("http://", "https://")):
        from ablate.tracking.auth import check_server

        check_server(uri, timeout)
        return
    if uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AblateError(f"tracking.uri={uri}: cannot create {folder} ({exc})") from exc
        if not os.access(folder, os.W_OK):
            raise AblateError(f"tracking.uri={uri}: {folder} is not writable")


def absent(uri: str) -> bool:
    """Whether ``uri`` is a sqlite store whose file is not there (yet): reading it through
    MLflow would create it."""
    return uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()


def artifact_root(uri: str) -> str | None:
    """``mlartifacts/`` beside a sqlite store; None (the server's choice) for other stores.

    Without it MLflow puts a sqlite store's artifacts in ``./mlruns`` of whichever process
    created the experiment, so runs from different folders scatter their artifacts.
    """
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
    return None


@contextlib.contextmanager
def schema_lock(uri: str) -> Iterator[None]:
    """Hold ``<db>.lock`` while a sqlite store's schema and experiment are created (or while
    a reader opens a store that may be fresh: MLflow migrates a fresh file on first open).

    Sweeps started at the same moment each create the schema of a fresh file ("table datasets
    already exists"): sqlite serialises writes, not MLflow's migrations. A server store migrates
    once at its own start, so needs nothing.
    """
    if not uri.startswith("sqlite:///"):
        yield
        return
    from filelock import FileLock

    with FileLock(uri.removeprefix("sqlite:///") + ".lock", timeout=300):
        yield


def prepare(uri: str, experiment: str, stale_after_min: float | None = None) -> str:
    """Create the store's schema and the experiment if missing; return the experiment id.

    With ``stale_after_min``, RUNNING runs whose process died are marked KILLED first.

    Called once before the jobs of a sweep start (``ablate.sweep.Sweep``): parallel jobs racing to
    create tables crash, and one losing the race to create the experiment logs its run into
    "Default" without an error.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from ablate.tracking.access import check_can_run
    from ablate.tracking.stale import mark_stale_runs

    check_reachable(uri)
    check_can_run(uri, experiment)  # before anything is created: a reader's run is one line
    try:
        with schema_lock(uri):
            client = MlflowClient(tracking_uri=uri)  # a sqlite store migrates here
            exp = client.get_experiment_by_name(experiment)
            if exp is None:
                try:
                    return client.create_experiment(
                        experiment, artifact_location=artifact_root(uri), tags=KIND
                    )
                except MlflowException:  # another process (or server client) created it first
                    exp = client.get_experiment_by_name(experiment)
            if EXPERIMENT_KIND not in exp.tags:  # an experiment made before, or by MLflow itself
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, KIND[EXPERIMENT_KIND])
    except MlflowException as exc:
        raise AblateError(f"tracking.uri={uri}: the MLflow store is not usable: {exc}") from exc
    if exp.lifecycle_stage == "deleted":
        raise AblateError(
            f"MLflow experiment {experiment!r} in {uri} is deleted; restore it "
            f"(mlflow experiments restore --experiment-id {exp.experiment_id}) or choose "
            f"another tracking.experiment"
        )
    if stale_after_min is not None:
        mark_stale_runs(client, exp.experiment_id, stale_after_min * 60)
    return exp.experiment_id


def all_runs(client, experiment_id: str, filter_string: str = "", *, deleted: bool = False) -> list:
    """Every run of the experiment (that ``filter_string`` selects), every page read; the
    deleted ones too with ``deleted``."""
    from mlflow.entities import ViewType

    # mlflow.search_runs pages by itself, but only through the process-wide tracking URI, which
    # reading a store given by --uri must not change: this client's pages, read to the end.
    view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
    runs, token = [], None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string, view, max_results=1000, page_token=token
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs
