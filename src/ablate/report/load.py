"""Reading tracked runs from an MLflow store into tidy tables (``load_runs``): one row per run,
one row per run x metric x epoch. Reads only the store: a run's primary metric is the one it
logged ``best_dev_<metric>`` for, what it scores one by one the count it logged."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ablate.config import RECIPE_LR_TAG, TUNED_TAG, default_tracking_uri
from ablate.errors import AblateError
from ablate.tracking.history import latest_per_step

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run otherwise

from mlflow.exceptions import MlflowException  # noqa: E402  (after the environment it reads)
from mlflow.tracking import MlflowClient  # noqa: E402

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
}


def primary_metric(metrics: dict[str, float], default: str = "accuracy") -> str:
    """The run's primary metric: the one it logged ``best_dev_<metric>`` for."""
    best = sorted(k.removeprefix("best_dev_") for k in metrics if k.startswith("best_dev_"))
    return best[0] if len(best) == 1 else default


def item_name(metrics: dict[str, float]) -> str:
    """What the run scores one by one: ``words`` (token tasks log ``dev_words``), else
    ``sentences``."""
    return "words" if "dev_words" in metrics else "sentences"


@dataclass
class Runs:
    """Runs of one experiment as read from MLflow.

    ``runs``: one row per run (every status); ``history``: per-epoch metrics, one row per run x
    metric x epoch (FINISHED runs); ``params``: every logged param of each run, by run id.
    """

    runs: pd.DataFrame
    history: pd.DataFrame
    params: dict[str, dict[str, str]]
    source: dict[str, str] = field(default_factory=dict)


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


def _search(client: MlflowClient, experiment_id: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def latest_sweep(runs: list):
    """The newest sweep's parent run (tag ``ablate.role=sweep``), or None."""
    parents = [r for r in runs if r.data.tags.get("ablate.role") == "sweep"]
    return max(parents, key=lambda r: r.info.start_time) if parents else None


def _sweep_filter(runs: list, sweep: str) -> tuple[str | None, str | None]:
    """(parent run id, sweep folder) of ``sweep``: a multirun folder or ``latest``."""
    if sweep == "latest":
        parent = latest_sweep(runs)
        if parent is not None:
            return parent.info.run_id, parent.data.tags.get("hydra.sweep_dir")
        tagged = [r for r in runs if "hydra.sweep_dir" in r.data.tags]  # runs of older versions
        if not tagged:
            raise AblateError("--sweep latest: no sweep (a --multirun) in this experiment")
        return None, max(tagged, key=lambda r: r.info.start_time).data.tags["hydra.sweep_dir"]
    folder = str(Path(sweep).expanduser().resolve())
    parents = [
        r for r in runs
        if r.data.tags.get("ablate.role") == "sweep"
        and r.data.tags.get("hydra.sweep_dir") == folder
    ]  # fmt: skip
    return (parents[0].info.run_id if parents else None), folder


def _name(params: dict[str, str], key: str) -> str | None:
    # data.name, freeze.name, model.name; runs of earlier versions logged them as data, ...
    return params.get(f"{key}.name", params.get(key))


def load_runs(
    experiment: str = "ablate",
    uri: str | None = None,
    *,
    data: str | Sequence[str] | None = None,
    model: str | Sequence[str] | None = None,
    sweep: str | None = None,
    parent: str | None = None,
    status: str | Sequence[str] | None = None,
    metric: str | None = None,
) -> Runs:
    """Read the runs of ``experiment`` from the store at ``uri`` (default: the project's store).

    Filters: ``data``/``model`` (their short names), ``sweep`` (a multirun folder or
    ``"latest"``: that sweep's runs, the children of its parent run), ``parent`` (a sweep's
    parent run id), ``status`` (e.g. ``"FINISHED"``). A sweep's parent run itself is no training
    run and never listed. ``metric`` is the primary metric; by default each run's own.
    Per-epoch histories come from MLflow's metric history (``search_runs`` keeps only the last
    value); a run's ``train_time_s`` is the sum of its per-epoch ``epoch_time_s`` plus its frozen
    features' one-off computation (``cache_frozen_time_s``; training only:
    the Trainer's ``train_runtime_s``, kept as ``trainer_runtime_s``, also counts the dev
    evaluation after each epoch, which freezing does not change); ``wall_s`` its whole run;
    ``load_per_cpu`` the highest machine load per usable CPU at the end of one of its epochs.
    """
    uri = uri or default_tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    try:
        exp = client.get_experiment_by_name(experiment)
    except MlflowException as exc:
        raise AblateError(f"{uri}: the MLflow store is not readable: {exc}") from exc
    if exp is None:
        raise AblateError(f"no MLflow experiment {experiment!r} in {uri}")
    found = _search(client, exp.experiment_id)
    sweep_dir = None
    if sweep:
        parent, sweep_dir = _sweep_filter(found, sweep)
    wanted = {"data": _as_set(data), "model": _as_set(model), "status": _as_set(status)}

    rows, params = [], {}
    for r in found:
        p, tags, m = r.data.params, r.data.tags, r.data.metrics
        if tags.get("ablate.role") == "sweep":
            continue
        if parent and tags.get("mlflow.parentRunId") != parent:
            continue
        if not parent and sweep_dir and tags.get("hydra.sweep_dir") != sweep_dir:
            continue
        values = {"data": _name(p, "data"), "model": _name(p, "model"), "status": r.info.status}
        if any(keep is not None and values[k] not in keep for k, keep in wanted.items()):
            continue
        task = p.get("data.task")
        name = metric or primary_metric(m)
        rows.append(
            {
                "run_id": r.info.run_id,
                "run_name": r.info.run_name,
                "status": r.info.status,
                "start_time": pd.to_datetime(r.info.start_time, unit="ms"),
                "data": _name(p, "data"),
                "model": _name(p, "model"),
                "freeze": _name(p, "freeze"),
                "seed": _int(p.get("seed")),
                "task": task,
                "items": item_name(m),
                "metric": name,
                # early stopping restored the best epoch: the final model's dev score is the best
                "dev": m.get(f"{'best_' if _restored_best(p) else ''}dev_{name}"),
                "best_dev": m.get(f"best_dev_{name}"),
                "test": m.get(f"test_{name}"),
                **{col: m.get(key) for col, key in _RUN_METRICS.items()},
                "epochs": _int(p.get("trainer.epochs")),
                "lr": _float(p.get("trainer.lr")),
                "tuned": TUNED_TAG in tags,  # at the lr its strategy's study picked
                "recipe_lr": tags.get(RECIPE_LR_TAG),  # the lr that one replaced
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
        for key in (f"dev_{row.metric}", "train_loss", "epoch_time_s", "load_per_cpu"):
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
    source = {
        "uri": uri,
        "experiment": experiment,
        **{k: ",".join(sorted(v)) for k, v in wanted.items() if v},
        **({"sweep": sweep_dir} if sweep_dir else {}),
        **({"parent": parent} if parent else {}),
        **({"metric": metric} if metric else {}),
    }
    return Runs(runs=runs, history=history_df, params=params, source=source)


_RUN_COLUMNS = [
    "run_id", "run_name", "status", "start_time", "data", "model", "freeze", "seed", "task",
    "items", "metric", "dev", "best_dev", "test", *_RUN_METRICS, "train_time_s", "epochs",
    "lr", "tuned", "recipe_lr", "wall_s", "sweep_dir", "job_num", "git_commit", "error",
]  # fmt: skip
_HISTORY_COLUMNS = ["run_id", "data", "model", "freeze", "seed", "key", "epoch", "value"]


def _restored_best(params: dict[str, str]) -> bool:
    return params.get("trainer.early_stopping_patience", "None") not in ("None", "null", "")
