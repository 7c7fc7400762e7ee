"""Reading tracked runs from an MLflow store into tidy tables (``load_runs``): one row per run,
one row per run x metric x epoch. Reads only the store: a run's primary metric is the one it
logged ``best_dev_<metric>`` for, what it scores one by one the count it logged."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ablate.config import RECIPE_LR_TAG, STUDY_TAG, TUNED_TAG, default_tracking_uri
from ablate.errors import AblateError
from ablate.lrstudy import EDGE_TAG
from ablate.report import scope
from ablate.tracking.history import latest_per_step
from ablate.tracking.params import (
    CPU_TAG,
    OPTION_KEYS_TAG,
    RESUMED_TAG,
    primary_metric,
    shared,
)
from ablate.tracking.store import absent, all_runs, check_reachable
from ablate.training.resources import PEAK_RSS_TAG

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run otherwise

from mlflow.exceptions import MlflowException  # noqa: E402  (after the environment it reads)
from mlflow.tracking import MlflowClient  # noqa: E402

# what a report (and an archive) can be narrowed to: a run param's short name, or its status
FILTERS = {
    "data": "only these datasets (the `data` param)",
    "model": "only these models (the `model` param)",
    "freeze": "only these strategies (the `freeze` param)",
    "status": "only runs with these statuses",
}

_RUN_METRICS = {
    "train_flops": "train_flops",
    "trainable_params": "trainable_params",
    "total_params": "total_params",
    "trainable_pct": "trainable_pct",
    "trainer_runtime_s": "train_runtime_s",
    "samples_per_s": "train_samples_per_s",
    "peak_rss_mb": "peak_rss_mb",
    "dev_words": "dev_words",
    "test_words": "test_words",
    "cache_frozen_time_s": "cache_frozen_time_s",
    "jobs_on_gpu": "jobs_on_gpu",
    "busy_cpus_at_start": "busy_cpus_at_start",
}


def item_name(metrics: dict[str, float]) -> str:
    """What the run scores one by one: ``words`` (token tasks log ``dev_words``), else
    ``sentences``."""
    return "words" if "dev_words" in metrics else "sentences"


@dataclass
class Runs:
    """Runs of one experiment as read from MLflow.

    ``runs``: one row per run (every status); ``history``: per-epoch metrics, one row per run x
    metric x epoch (FINISHED runs); ``params``: every logged param of each run, by run id;
    ``unrun``: the jobs of the sweeps' grids that have no run in them, as rows of the runs a
    report leaves out (``run_name`` names the job, ``status`` MISSING, ``reason``).
    """

    runs: pd.DataFrame
    history: pd.DataFrame
    params: dict[str, dict[str, str]]
    source: dict[str, str] = field(default_factory=dict)
    unrun: list[dict] = field(default_factory=list)


def _as_set(value: str | Sequence[str] | None) -> set[str] | None:
    if value is None:
        return None
    return {value} if isinstance(value, str) else set(value)


def _int(value: str | None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _client(uri: str, experiment: str):
    """A client of the store at ``uri`` and the experiment's id; an ``AblateError`` that names
    the fix where there is no such store or experiment (reading never creates a store)."""
    if absent(uri):
        raise AblateError(
            f"no MLflow store at {uri.removeprefix('sqlite:///')}: train first (make run), or "
            "pass the store with --uri"
        )
    if uri.startswith(("http://", "https://")):
        check_reachable(uri)  # a server that is away or refuses the credentials: one line
    try:
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        names = [e.name for e in client.search_experiments()] if exp is None else []
    except MlflowException as exc:
        first = str(exc).split(". ")[0]
        fix = "pass another with --uri"
        if "://" not in uri and Path(uri).is_file():  # a sqlite file named without its scheme
            fix = f"pass a sqlite file as --uri sqlite:///{Path(uri).resolve()}"
        raise AblateError(f"{uri}: the MLflow store is not readable ({first}); {fix}") from exc
    if exp is None:
        there = [n for n in names if n != "Default"]
        raise AblateError(
            f"no MLflow experiment {experiment!r} in {uri}; "
            + (
                f"its experiments: {', '.join(there)}: pass one with --experiment"
                if there
                else "it holds none yet: train first (make run), or pass another store with --uri"
            )
        )
    return client, exp.experiment_id


def overview(uri: str, experiment: str) -> str:
    """What ``experiment`` holds, for an error message: its latest sweeps that have runs (what
    ``--sweep`` takes) and its FINISHED runs by dataset (what ``--data`` takes)."""
    client, experiment_id = _client(uri, experiment)
    found = all_runs(client, experiment_id)
    done = Counter(
        param_name(r.data.params, "data") or "?"
        for r in found
        if not scope.is_sweep(r) and r.info.status == "FINISHED"
    )
    by_data = ", ".join(f"{d} ({n})" for d, n in sorted(done.items()))
    return f"{scope.listing(found)}; FINISHED runs by dataset: {by_data or 'none'}"


def describe_source(source: dict[str, str]) -> str:
    """Where a report's runs came from, in words: experiment, store and filters."""
    filters = ", ".join(f"{k}={v}" for k, v in source.items() if k not in ("uri", "experiment"))
    return f"experiment {source.get('experiment')!r} in {source.get('uri')}" + (
        f" ({filters})" if filters else ""
    )


def _runs_by_id(client: MlflowClient, ids: set[str]) -> list:
    """The runs with these ids that still exist (not deleted)."""
    out = []
    for run_id in sorted(ids):
        try:
            run = client.get_run(run_id)
        except MlflowException:
            continue
        if run.info.lifecycle_stage == "active":
            out.append(run)
    return out


def param_name(params: dict[str, str], key: str) -> str | None:
    """A run's ``data``, ``model`` or ``freeze`` option: its ``<key>.name`` param (runs of
    earlier versions logged ``<key>``)."""
    return params.get(f"{key}.name", params.get(key))


def load_runs(
    experiment: str = "ablate",
    uri: str | None = None,
    *,
    data: str | Sequence[str] | None = None,
    model: str | Sequence[str] | None = None,
    freeze: str | Sequence[str] | None = None,
    sweep: str | None = None,
    parent: str | None = None,
    status: str | Sequence[str] | None = None,
    metric: str | None = None,
) -> Runs:
    """Read the runs of ``experiment`` from the store at ``uri`` (default: the project's store).

    Filters: ``data``/``model``/``freeze`` (their short names), ``sweep`` (a multirun folder, or
    ``"latest"``: the newest sweep that has runs), ``parent`` (a sweep's parent run id),
    ``status`` (e.g. ``"FINISHED"``). A sweep's runs are its parent run's children and the
    FINISHED runs it reused for jobs it skipped (``ablate.reused.<job>`` tags; ``scope``). A
    sweep's parent run itself is no training run and never listed. ``metric`` is the primary
    metric; by default each run's own.
    Per-epoch histories come from MLflow's metric history (``search_runs`` keeps only the last
    value); a run's ``train_time_s`` is the sum of its per-epoch ``epoch_time_s`` plus its frozen
    features' one-off computation (``cache_frozen_time_s``; training only:
    the Trainer's ``train_runtime_s``, kept as ``trainer_runtime_s``, also counts the dev
    evaluation after each epoch, which freezing does not change); ``wall_s`` its whole run;
    ``load_per_cpu`` the highest machine load per usable CPU at the end of one of its epochs;
    ``cpu_gflops`` the median of its CPU speed probes (NaN where it recorded none).
    """
    uri = uri or default_tracking_uri()
    client, experiment_id = _client(uri, experiment)
    found = all_runs(client, experiment_id)
    sweep_dir, ids, parents = None, None, []
    if sweep:
        ids, sweep_dir, parents = scope.select(found, sweep, experiment)
        parent = ",".join(parents) or None
    elif parent:
        ids, parents = scope.members(found, parent), [parent]
    if ids is not None:  # a reused run of another experiment, say
        found += _runs_by_id(client, ids - {r.info.run_id for r in found})
    unrun = [_unrun_row(job, found) for job in scope.unrun(found, parents)]
    asked = {"data": data, "model": model, "freeze": freeze, "status": status}
    wanted = {key: _as_set(asked[key]) for key in FILTERS}

    rows, params = [], {}
    for r in found:
        p, tags, m = r.data.params, r.data.tags, r.data.metrics
        if scope.is_sweep(r) or (ids is not None and r.info.run_id not in ids):
            continue
        values = {key: param_name(p, key) for key in FILTERS if key != "status"}
        values["status"] = r.info.status
        if any(keep is not None and values[k] not in keep for k, keep in wanted.items()):
            continue
        task = p.get("data.task")
        rows.append(
            {
                "run_id": r.info.run_id,
                "run_name": r.info.run_name,
                "status": r.info.status,
                "start_time": pd.to_datetime(r.info.start_time, unit="ms"),
                "data": param_name(p, "data"),
                "model": param_name(p, "model"),
                "freeze": param_name(p, "freeze"),
                "seed": _int(p.get("seed")),
                "task": task,
                "items": item_name(m),
                **scores(p, m, metric),
                **{col: m.get(key) for col, key in _RUN_METRICS.items()},
                "epochs": _int(p.get("trainer.epochs")),
                "lr": _float(p.get("trainer.lr")),
                "tuned": TUNED_TAG in tags,  # at the lr its strategy's study picked
                "recipe_lr": tags.get(RECIPE_LR_TAG),  # the lr that one replaced
                "lr_edge": tags.get(EDGE_TAG),  # that lr lay at its study's range's edge
                "study": tags.get(STUDY_TAG),  # an lr study's trial: its study
                "option_keys": tags.get(OPTION_KEYS_TAG),  # its option's own keys, as it ran
                "resumed": tags.get(RESUMED_TAG) == "true",  # its MLflow run reopened
                "cpu": tags.get(CPU_TAG),  # the machine its times were measured on
                "peak_rss_scope": tags.get(PEAK_RSS_TAG),  # job, process, or not recorded
                "wall_s": (r.info.end_time - r.info.start_time) / 1000 if r.info.end_time else None,
                "sweep_dir": tags.get("hydra.sweep_dir"),
                "job_num": _int(tags.get("hydra.job_num")),
                "git_commit": tags.get("git.commit"),
                "error": tags.get("error"),
            }
        )
        params[r.info.run_id] = dict(p)
    runs = pd.DataFrame(rows, columns=_RUN_COLUMNS)
    runs["seed"] = runs["seed"].astype("Int64")
    runs = runs.sort_values("start_time", ignore_index=True)

    hist = []
    for row in runs[runs.status == "FINISHED"].itertuples():
        for key in (f"dev_{row.metric}", "train_loss", *_PER_EPOCH):
            points = latest_per_step(client.get_metric_history(row.run_id, key))
            for step, value in points.items():  # a resumed run may have logged a step twice
                hist.append(
                    (row.run_id, row.data, row.model, row.freeze, row.seed, key, step, value)
                )
    history_df = pd.DataFrame(hist, columns=_HISTORY_COLUMNS)
    epochs = history_df[history_df.key == "epoch_time_s"]
    # the frozen features computed once before the first epoch (trainer.cache_frozen) are part
    # of what training cost
    once = runs.cache_frozen_time_s.astype(float).fillna(0.0)
    runs["train_time_s"] = runs.run_id.map(epochs.groupby("run_id").value.sum()) + once
    load = history_df[history_df.key == "load_per_cpu"]
    runs["load_per_cpu"] = runs.run_id.map(load.groupby("run_id").value.max())
    speed = history_df[history_df.key == "cpu_gflops"]
    runs["cpu_gflops"] = runs.run_id.map(speed.groupby("run_id").value.median())
    source = {
        "uri": uri,
        "experiment": experiment,
        **{k: ",".join(sorted(v)) for k, v in wanted.items() if v},
        **({"sweep": sweep_dir} if sweep_dir else {}),
        **({"parent": parent} if parent else {}),
        **({"metric": metric} if metric else {}),
    }
    return Runs(runs=runs, history=history_df, params=params, source=source, unrun=unrun)


def _unrun_row(job: dict, found: list) -> dict:
    """A job without a run as a row of the runs left out: the keys its own overrides set, else
    the values every run of its sweep shares (the sweep's params, recorded as it ends; those of
    its runs where it never ended, killed outright)."""
    own = dict(o.lstrip("+~").partition("=")[::2] for o in job["overrides"].split())
    sweep = job["sweep"]
    ran = scope.members(found, sweep.info.run_id)
    common = sweep.data.params or shared([r for r in found if r.info.run_id in ran])
    name = f"job {job['job']}" + (f" ({job['overrides']})" if job["overrides"] else "")

    def option(key: str) -> str | None:  # a swept option the job names, else the sweep's
        return own.get(key, own.get(f"{key}.name", param_name(common, key)))

    return {
        "run_name": name,
        "data": own.get("data.treebank", option("data")),
        "model": option("model"),
        "freeze": option("freeze"),
        "seed": _int(own.get("seed", common.get("seed"))),
        "status": "MISSING",
        "reason": job["reason"],
    }


EVERY_RUN = "none with runs, so every run"  # source["sweep"] where "latest" found no sweep


def load_scope(
    experiment: str = "ablate", uri: str | None = None, sweep: str | None = "latest", **filters
) -> Runs:
    """The runs ``make report`` reports (and the notebook): those of ``sweep`` (a multirun
    folder, or ``latest``: the newest sweep that has runs), or with ``sweep=None`` every run
    (``--all``); ``latest`` where the experiment holds no sweep with runs is every run, and
    ``source["sweep"]`` says so (``EVERY_RUN``). ``filters``: the other ``load_runs`` filters."""
    if sweep is None:
        return load_runs(experiment, uri, **filters)
    try:
        return load_runs(experiment, uri, sweep=sweep, **filters)
    except scope.NoSweep:
        if sweep != "latest":
            raise
    runs = load_runs(experiment, uri, **filters)
    runs.source["sweep"] = EVERY_RUN
    return runs


_RUN_COLUMNS = [
    "run_id",
    "run_name",
    "status",
    "start_time",
    "data",
    "model",
    "freeze",
    "seed",
    "task",
    "items",
    "metric",
    "dev",
    "best_dev",
    "test",
    *_RUN_METRICS,
    "train_time_s",
    "epochs",
    "lr",
    "tuned",
    "recipe_lr",
    "lr_edge",
    "study",
    "option_keys",
    "resumed",
    "cpu",
    "peak_rss_scope",
    "wall_s",
    "sweep_dir",
    "job_num",
    "git_commit",
    "error",
]
# the per-epoch metrics a run's history keeps besides its dev score and training loss
_PER_EPOCH = ("epoch_time_s", "load_per_cpu", "cpu_gflops")
_HISTORY_COLUMNS = ["run_id", "data", "model", "freeze", "seed", "key", "epoch", "value"]


def scores(params: dict[str, str], metrics: dict[str, float], metric: str | None = None) -> dict:
    """A run's primary ``metric`` (by default its own) and its final model's dev, best dev and
    test scores, as the report reads them from its params and last metric values."""
    name = metric or primary_metric(metrics)
    # early stopping restored the best epoch: the final model's dev score is the best
    restored = params.get("trainer.early_stopping_patience", "None") not in ("None", "null", "")
    return {
        "metric": name,
        "dev": metrics.get(f"{'best_' if restored else ''}dev_{name}"),
        "best_dev": metrics.get(f"best_dev_{name}"),
        "test": metrics.get(f"test_{name}"),
    }
