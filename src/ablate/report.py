"""Comparison report built only from tracked MLflow runs: ``python -m ablate.report``.

``load_runs`` reads an experiment into tidy DataFrames (one row per run, one row per run x metric
x epoch); ``build`` turns them into a summary per dataset with intervals vs the ``none`` baseline
and lists every run it leaves out; ``write`` saves ``summary.csv``, ``summary.md`` and one PNG per
chart. ``notebooks/compare.ipynb`` calls the same functions.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.config import default_tracking_uri, project_root
from ablate.errors import AblateError

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run otherwise

from mlflow.exceptions import MlflowException  # noqa: E402  (after the environment it reads)
from mlflow.tracking import MlflowClient  # noqa: E402

BASELINE = "none"
# Full fine-tuning first, then from least to most frozen, then the parameter-efficient methods.
STRATEGY_ORDER = (
    "none", "embeddings", "first2", "first4", "alt", "last2", "all", "head_only",
    "bitfit", "lora", "lora_qkv", "llrd", "gradual",
)  # fmt: skip
CHARTS = ("accuracy", "convergence", "accuracy_vs_params", "train_time")
LEVEL = 0.95
N_BOOT = 1000
# Params that may differ between the seeds of one strategy without making them different studies
# (where files sit, how many threads or how large the eval batches were).
_FREE_KEYS = ("seed", "freeze")  # exact: every freeze.* option is a setting of the strategy
_FREE_PARAMS = (
    "tracking.", "data.root", "model.name_or_path",
    "trainer.threads", "trainer.eval_batch_size", "data.tokenized_cache", "trainer.measure_flops",
    "trainer.sorted_eval", "trainer.pin_memory", "trainer.fused_adamw", "trainer.embedding_rows",
    "trainer.cache_frozen_eval",
    "trainer.fast_dropout",  # other dropout masks, the same distribution: like another seed
    "trainer.round_shapes",  # padding only (packed rows draw other dropout masks)
)  # fmt: skip
_RUN_METRICS = {
    "trainable_params": "trainable_params",
    "total_params": "total_params",
    "trainable_pct": "trainable_pct",
    "trainer_runtime_s": "train_runtime_s",
    "samples_per_s": "train_samples_per_s",
    "peak_rss_mb": "peak_rss_mb",
    "dev_words": "dev_words",
    "test_words": "test_words",
}


def strategy_order(names: Iterable[str]) -> list[str]:
    """``names`` in the report's order: ``STRATEGY_ORDER`` first, any others alphabetically."""
    names = set(names)
    return [s for s in STRATEGY_ORDER if s in names] + sorted(names - set(STRATEGY_ORDER))


def _task_attr(task: str | None, attr: str, default: str) -> str:
    try:
        from ablate.tasks import TASKS  # imports transformers: only when a report needs it
    except ImportError:
        return default
    known = TASKS.get(task or "")
    return getattr(known, attr) if known else default


@functools.lru_cache
def primary_metric(task: str | None) -> str:
    """The headline metric of a ``data.task`` (``ablate.tasks``); ``accuracy`` if unknown."""
    return _task_attr(task, "primary_metric", "accuracy")


@functools.lru_cache
def item_name(task: str | None) -> str:
    """What a ``data.task`` scores one by one (``words``, ``sentences``); ``items`` if unknown."""
    return _task_attr(task, "item_name", "items")


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


@dataclass
class Report:
    """A summary row per dataset (and model) x strategy, the runs behind it, and what was left out.

    Metric values are in % and differences in percentage points; ``summary.*_method`` say how each
    interval was computed.
    """

    summary: pd.DataFrame
    runs: pd.DataFrame
    history: pd.DataFrame
    excluded: pd.DataFrame
    notes: list[str]
    source: dict[str, str]
    baseline: str = BASELINE


def _as_set(value: str | Sequence[str] | None) -> set[str] | None:
    if value is None:
        return None
    return {value} if isinstance(value, str) else set(value)


def _int(value: str | None) -> int | None:
    try:
        return int(value)
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


def _sweep_dir(runs: list, sweep: str) -> str:
    if sweep != "latest":
        return str(Path(sweep).expanduser().resolve())
    tagged = [r for r in runs if "hydra.sweep_dir" in r.data.tags]
    if not tagged:
        raise AblateError("--sweep latest: no run of this experiment has a hydra.sweep_dir tag")
    return max(tagged, key=lambda r: r.info.start_time).data.tags["hydra.sweep_dir"]


def load_runs(
    experiment: str = "ablate",
    uri: str | None = None,
    *,
    data: str | Sequence[str] | None = None,
    model: str | Sequence[str] | None = None,
    sweep: str | None = None,
    status: str | Sequence[str] | None = None,
    metric: str | None = None,
) -> Runs:
    """Read the runs of ``experiment`` from the store at ``uri`` (default: the project's store).

    Filters: ``data``/``model`` (the short params), ``sweep`` (a multirun folder, matched against
    the ``hydra.sweep_dir`` tag, or ``"latest"``), ``status`` (e.g. ``"FINISHED"``). ``metric`` is
    the primary metric; by default each run's comes from its ``data.task``. Per-epoch histories
    come from MLflow's metric history (``search_runs`` only keeps the last value); a run's
    ``train_time_s`` is the sum of its per-epoch ``epoch_time_s`` (training only: the Trainer's
    ``train_runtime_s``, kept as ``trainer_runtime_s``, also counts the dev evaluation after each
    epoch, which freezing does not change).
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
    sweep_dir = _sweep_dir(found, sweep) if sweep else None
    wanted = {"data": _as_set(data), "model": _as_set(model), "status": _as_set(status)}

    rows, params = [], {}
    for r in found:
        p, tags, m = r.data.params, r.data.tags, r.data.metrics
        if sweep_dir and tags.get("hydra.sweep_dir") != sweep_dir:
            continue
        values = {"data": p.get("data"), "model": p.get("model"), "status": r.info.status}
        if any(keep is not None and values[k] not in keep for k, keep in wanted.items()):
            continue
        task = p.get("data.task")
        name = metric or primary_metric(task)
        rows.append(
            {
                "run_id": r.info.run_id,
                "run_name": r.info.run_name,
                "status": r.info.status,
                "start_time": pd.to_datetime(r.info.start_time, unit="ms"),
                "data": p.get("data"),
                "model": p.get("model"),
                "freeze": p.get("freeze"),
                "seed": _int(p.get("seed")),
                "task": task,
                "metric": name,
                # early stopping restored the best epoch: the final model's dev score is the best
                "dev": m.get(f"{'best_' if _restored_best(p) else ''}dev_{name}"),
                "best_dev": m.get(f"best_dev_{name}"),
                "test": m.get(f"test_{name}"),
                **{col: m.get(key) for col, key in _RUN_METRICS.items()},
                "epochs": _int(p.get("trainer.epochs")),
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
        for key in (f"dev_{row.metric}", "train_loss", "epoch_time_s"):
            points = latest_per_step(client.get_metric_history(row.run_id, key))
            for step, value in points.items():  # a resumed run may have logged a step twice
                hist.append(
                    (row.run_id, row.data, row.model, row.freeze, row.seed, key, step, value)
                )
    history_df = pd.DataFrame(hist, columns=_HISTORY_COLUMNS)
    epochs = history_df[history_df.key == "epoch_time_s"]
    runs["train_time_s"] = runs.run_id.map(epochs.groupby("run_id").value.sum())
    source = {
        "uri": uri,
        "experiment": experiment,
        **{k: ",".join(sorted(v)) for k, v in wanted.items() if v},
        **({"sweep": sweep_dir} if sweep_dir else {}),
        **({"metric": metric} if metric else {}),
    }
    return Runs(runs=runs, history=history_df, params=params, source=source)


def latest_per_step(points: Sequence) -> dict[int, float]:
    """MLflow metric points as {step: value}, in step order, the latest point of each step."""
    latest = {}
    for m in sorted(points, key=lambda m: (m.step, m.timestamp)):
        latest[m.step] = m.value
    return latest


_RUN_COLUMNS = [
    "run_id", "run_name", "status", "start_time", "data", "model", "freeze", "seed", "task",
    "metric", "dev", "best_dev", "test", *_RUN_METRICS, "train_time_s", "epochs", "sweep_dir",
    "job_num", "git_commit", "error",
]  # fmt: skip
_HISTORY_COLUMNS = ["run_id", "data", "model", "freeze", "seed", "key", "epoch", "value"]
_EXCLUDED_COLUMNS = ["run_name", "data", "model", "freeze", "seed", "status", "reason"]


# --- intervals ---------------------------------------------------------------------------------


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Mean and Student-t interval of the mean of ``values`` (NaN bounds for fewer than 2)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def bootstrap_interval(
    values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL
) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` resampled with replacement ``n_boot`` times."""
    values = np.asarray(values, dtype=float)
    # Resampling n values only changes how often each distinct value is drawn: drawing those counts
    # from a multinomial is the same distribution, in memory that does not grow with n.
    distinct, counts = np.unique(values, return_counts=True)
    draws = np.random.default_rng(seed).multinomial(values.size, counts / values.size, n_boot)
    means = draws @ distinct / values.size
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return float(lo), float(hi)


def load_predictions(uri: str, run_id: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Dev gold and predicted label ids of a run (``predictions/dev.json``), or None if absent."""
    client = MlflowClient(tracking_uri=uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, "predictions/dev.json", tmp)
            ids = json.loads(Path(path).read_text())
        except (MlflowException, OSError, ValueError):
            return None
    return np.asarray(ids["gold"]), np.asarray(ids["pred"])


class _Predictions:
    """Per-run dev predictions, loaded once and only for the rows that need a bootstrap."""

    def __init__(self, uri: str, enabled: bool):
        self.uri, self.enabled, self.cache = uri, enabled, {}

    def correct(self, run_ids: Sequence[str]) -> list[np.ndarray] | None:
        """Word-level correctness (0/1) of each run, or None unless all share the same gold."""
        if not self.enabled:
            return None
        loaded = []
        for run_id in run_ids:
            if run_id not in self.cache:
                self.cache[run_id] = load_predictions(self.uri, run_id)
            loaded.append(self.cache[run_id])
        if any(p is None for p in loaded):
            return None
        gold = loaded[0][0]
        if any(g.shape != gold.shape or (g != gold).any() for g, _ in loaded):
            return None
        return [(pred == g).astype(float) for g, pred in loaded]


# --- summary -----------------------------------------------------------------------------------


def settings(params: dict[str, str]) -> dict[str, str]:
    """A run's params without those that may differ between seeds of one study (seed, where
    files sit, threads, ...): runs with equal settings are comparable."""
    return {
        k: v for k, v in params.items() if k not in _FREE_KEYS and not k.startswith(_FREE_PARAMS)
    }


def _diff(a: dict[str, str], b: dict[str, str]) -> str:
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return ", ".join(f"{k}={a.get(k, '-')} (latest: {b.get(k, '-')})" for k in keys)


def _select(runs: Runs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split runs into the ones a summary uses and the ones left out, with the reason."""
    df = runs.runs.sort_values("start_time", kind="stable", ignore_index=True)
    reasons: dict[str, str] = {}
    ident = df[["data", "model", "freeze"]].notna().all(axis=1) & df.seed.notna()
    for row in df[~ident].itertuples():
        reasons[row.run_id] = "not an ablate training run (no data/model/freeze/seed params)"
    for row in df[ident & (df.status != "FINISHED")].itertuples():
        why = f": {row.error}" if isinstance(row.error, str) else ""
        reasons[row.run_id] = f"{row.status}{why}"
    for row in df[ident & (df.status == "FINISHED") & df.dev.isna()].itertuples():
        reasons[row.run_id] = f"no dev_{row.metric} logged"

    ok = df[~df.run_id.isin(reasons)]
    # Seeds of one strategy must share every setting; the latest run defines which settings the
    # report shows (an earlier smoke run with other epochs must not become a "seed").
    for _, cell in ok.groupby(["data", "model", "freeze"]):
        latest = settings(runs.params[cell.run_id.iloc[-1]])
        for row in cell.itertuples():
            diff = _diff(settings(runs.params[row.run_id]), latest)
            if diff:
                reasons[row.run_id] = f"other settings than the latest {row.freeze} run: {diff}"
    ok = df[~df.run_id.isin(reasons)]
    for _, cell in ok.groupby(["data", "model", "freeze", "seed"]):
        for row in cell.iloc[:-1].itertuples():
            reasons[row.run_id] = f"superseded by the later run {cell.run_id.iloc[-1]}"

    used = df[~df.run_id.isin(reasons)].reset_index(drop=True)
    left = df[df.run_id.isin(reasons)].assign(reason=lambda d: d.run_id.map(reasons))
    left = left[_EXCLUDED_COLUMNS]

    # A strategy x seed that the grid implies (seeds used in the panel, strategies seen in it) but
    # for which no run exists at all.
    missing = []
    for (data, model), panel in df[ident].groupby(["data", "model"]):
        seeds = set(used[(used.data == data) & (used.model == model)].seed.dropna())
        for strategy in strategy_order(panel.freeze):
            have = set(panel[panel.freeze == strategy].seed)
            for seed in sorted(seeds - have):
                missing.append((None, data, model, strategy, seed, "MISSING", "no run logged"))
    left = pd.concat([left, pd.DataFrame(missing, columns=_EXCLUDED_COLUMNS)], ignore_index=True)
    return used, left


def _panels(df: pd.DataFrame) -> pd.Series:
    many_models = df.groupby("data").model.nunique().gt(1).any() if len(df) else False
    if many_models:
        return df.data + " · " + df.model
    return df.data.copy()


def _restored_best(params: dict[str, str]) -> bool:
    return params.get("trainer.early_stopping_patience", "None") not in ("None", "null", "")


def _row(cell: pd.DataFrame, base: pd.DataFrame | None, preds: _Predictions, boot: dict) -> dict:
    """The summary row of one strategy (``cell``: its runs, one per seed)."""
    dev, test = cell.dev * 100, cell.test * 100
    n = len(cell)
    # A mean of per-item correctness is an accuracy: the bootstrap over dev items (words or
    # sentences) estimates only that, not an F1.
    per_item = cell.metric.iloc[0] == "accuracy"
    items = f"dev {item_name(cell.task.iloc[0])}"
    why = (
        "no dev predictions logged"
        if per_item
        else f"no per-item bootstrap of {cell.metric.iloc[0]}"
    )
    row = {
        "n": n,
        "seeds": ",".join(str(s) for s in sorted(cell.seed)),
        "dev_mean_pct": dev.mean(),
        "dev_std_pct": dev.std(ddof=1) if n > 1 else math.nan,
        "dev_ci_low_pct": math.nan,
        "dev_ci_high_pct": math.nan,
        "dev_ci_method": "",
        "best_dev_mean_pct": (cell.best_dev * 100).mean(),
        "test_mean_pct": test.mean(),
        "test_std_pct": test.std(ddof=1) if n > 1 else math.nan,
        "trainable_params_m": cell.trainable_params.mean() / 1e6,
        "total_params_m": cell.total_params.mean() / 1e6,
        "train_time_s": cell.train_time_s.mean(skipna=False),
        "train_time_s_std": cell.train_time_s.std(ddof=1) if n > 1 else math.nan,
        "trainer_runtime_s": cell.trainer_runtime_s.mean(),
    }
    if n >= 3:
        _, lo, hi = t_interval(dev)
        row.update(dev_ci_low_pct=lo, dev_ci_high_pct=hi, dev_ci_method=f"t over {n} seeds")
    elif per_item and (correct := preds.correct(list(cell.run_id))) is not None:
        lo, hi = bootstrap_interval(np.mean(correct, axis=0) * 100, **boot)
        row.update(dev_ci_low_pct=lo, dev_ci_high_pct=hi, dev_ci_method=f"bootstrap over {items}")
    else:
        row["dev_ci_method"] = f"none ({n} seed{'s' if n > 1 else ''}, {why})"

    delta = {"delta_dev_pt": math.nan, "delta_ci_low_pt": math.nan, "delta_ci_high_pt": math.nan}
    delta["delta_method"] = "no baseline run"
    if base is not None and len(base):
        b = base.set_index("seed")
        for col, ours in (("param", "trainable_params"), ("time", "train_time_s")):
            delta[f"{col}_savings_pct"] = 100 * (1 - cell[ours].mean() / b[ours].mean())
        paired = cell[cell.seed.isin(b.index)]
        diffs = (paired.dev.to_numpy() - b.loc[paired.seed, "dev"].to_numpy()) * 100
        if cell.run_id.isin(base.run_id).all():
            delta.update(delta_dev_pt=0.0, delta_method="baseline")
        elif len(paired) >= 3:
            mean, lo, hi = t_interval(diffs)
            method = f"paired t over {len(paired)} seeds"
            delta.update(delta_dev_pt=mean, delta_ci_low_pt=lo, delta_ci_high_pt=hi)
            delta["delta_method"] = method
        elif len(paired):
            delta["delta_dev_pt"] = float(diffs.mean())
            ids = [*paired.run_id, *b.loc[paired.seed, "run_id"]]
            correct = preds.correct(ids) if per_item else None
            if correct is not None:
                k = len(paired)
                per_item_diff = np.mean(correct[:k], axis=0) - np.mean(correct[k:], axis=0)
                lo, hi = bootstrap_interval(per_item_diff * 100, **boot)
                delta.update(delta_ci_low_pt=lo, delta_ci_high_pt=hi)
                s = "s" if k > 1 else ""
                delta["delta_method"] = f"paired bootstrap over {items} ({k} seed{s})"
            else:
                s = "s" if len(paired) > 1 else ""
                delta["delta_method"] = f"none ({len(paired)} paired seed{s}, {why})"
        else:
            delta["delta_dev_pt"] = dev.mean() - b.dev.mean() * 100
            delta["delta_method"] = "none (no seed in common with the baseline; unpaired means)"
    row.update(delta)
    return row


_SUMMARY_COLUMNS = [
    "panel", "data", "model", "strategy", "metric", "n", "seeds",
    "dev_mean_pct", "dev_std_pct", "dev_ci_low_pct", "dev_ci_high_pct", "dev_ci_method",
    "best_dev_mean_pct", "test_mean_pct", "test_std_pct",
    "trainable_params_m", "total_params_m", "param_savings_pct",
    "train_time_s", "train_time_s_std", "time_savings_pct", "trainer_runtime_s",
    "delta_dev_pt", "delta_ci_low_pt", "delta_ci_high_pt", "delta_method",
]  # fmt: skip


def build(
    runs: Runs,
    *,
    baseline: str = BASELINE,
    n_boot: int = N_BOOT,
    boot_seed: int = 0,
    predictions: bool = True,
) -> Report:
    """Summarise ``runs``: one row per dataset (and model) x strategy, in ``STRATEGY_ORDER``.

    Only FINISHED runs with the primary metric count; the latest run per strategy x seed is used;
    everything else is listed in ``excluded`` with the reason. Δ vs ``baseline`` pairs runs by
    seed: a t-interval of the per-seed differences with >= 3 seeds, else a bootstrap over dev
    items (words or sentences; ``n_boot`` resamples, RNG seed ``boot_seed``) when dev
    predictions were logged.
    """
    used, excluded = _select(runs)
    if used.empty:
        listed = "; ".join(f"{r.run_name or r.freeze}: {r.reason}" for r in excluded.itertuples())
        raise AblateError(f"no usable runs in {runs.source}" + (f" ({listed})" if listed else ""))
    used = used.assign(panel=_panels(used))
    preds = _Predictions(runs.source.get("uri", default_tracking_uri()), predictions)
    boot = {"n_boot": n_boot, "seed": boot_seed}
    rows, notes = [], []
    for (panel, data, model), group in used.groupby(["panel", "data", "model"], sort=True):
        base = group[group.freeze == baseline]
        if base.empty:
            notes.append(f"{panel}: no `{baseline}` run, so no savings or Δ vs baseline.")
        for strategy in strategy_order(group.freeze):
            cell = group[group.freeze == strategy].sort_values("seed")
            metric = cell.metric.iloc[0]
            head = {"panel": panel, "data": data, "model": model, "strategy": strategy}
            rows.append({**head, "metric": metric, **_row(cell, base, preds, boot)})
        if differ := _differing_settings(group, runs.params):
            notes.append(f"{panel}: strategies were run with different settings: {differ}.")
        counts = group.groupby("freeze").size()
        if counts.nunique() > 1:
            notes.append(f"{panel}: strategies have different numbers of seeds: {_counts(counts)}.")
        if counts.max() == 1:
            notes.append(
                f"{panel}: one seed per strategy, so no spread over seeds (no ± std, no seed-level "
                f"intervals); intervals, where shown, are bootstraps over dev "
                f"{item_name(group.task.iloc[0])}."
            )
    summary = pd.DataFrame(rows).reindex(columns=_SUMMARY_COLUMNS)
    history = runs.history[runs.history.run_id.isin(used.run_id)].copy()
    history["panel"] = history.run_id.map(used.set_index("run_id").panel)
    return Report(
        summary=summary,
        runs=used,
        history=history.reset_index(drop=True),
        excluded=excluded.reset_index(drop=True),
        notes=notes,
        source=runs.source,
        baseline=baseline,
    )


def _differing_settings(group: pd.DataFrame, params: dict[str, dict[str, str]]) -> str:
    """Settings that differ between the strategies of one panel, e.g. runs from two grids."""
    by_strategy = {
        s: settings(params[group[group.freeze == s].run_id.iloc[-1]])
        for s in strategy_order(group.freeze)
    }
    keys = set().union(*by_strategy.values())
    parts = []
    for key in sorted(keys):
        values = {s: p.get(key, "-") for s, p in by_strategy.items()}
        if len(set(values.values())) > 1:
            parts.append(f"{key} ({', '.join(f'{s}: {v}' for s, v in values.items())})")
    return "; ".join(parts)


def _counts(counts: pd.Series) -> str:
    return ", ".join(f"{s}: {counts[s]}" for s in strategy_order(counts.index))


def make_report(experiment: str = "ablate", uri: str | None = None, **filters) -> Report:
    """``build(load_runs(experiment, uri, **filters))``."""
    return build(load_runs(experiment, uri, **filters))


# --- output ------------------------------------------------------------------------------------


def _num(x: float, digits: int = 2, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _params(m: float) -> str:
    return f"{m:.1f}" if m >= 100 else f"{m:.2f}" if m >= 1 else f"{m:.3g}"


def table(report: Report, panel: str | None = None) -> pd.DataFrame:
    """The summary as display strings (what ``summary.md`` shows), for one panel or all."""
    s = report.summary if panel is None else report.summary[report.summary.panel == panel]
    b = report.baseline
    out = []
    for r in s.itertuples():
        dev = _num(r.dev_mean_pct)
        dev += f" ± {_num(r.dev_std_pct)}" if r.n > 1 else " (1 seed)"
        if r.delta_method == "baseline":
            delta = "baseline"
        else:
            delta = _num(r.delta_dev_pt, sign=True)
            if not math.isnan(r.delta_ci_low_pt):
                delta += f" [{_num(r.delta_ci_low_pt, sign=True)}, "
                delta += f"{_num(r.delta_ci_high_pt, sign=True)}]"
        out.append(
            {
                "dataset": r.panel,
                "strategy": r.strategy,
                f"dev {r.metric} (%)": dev,
                "n": r.n,
                f"test {r.metric} (%)": _num(r.test_mean_pct)
                + (f" ± {_num(r.test_std_pct)}" if r.n > 1 else ""),
                "trainable params (M)": _params(r.trainable_params_m),
                f"param savings vs {b} (%)": _num(r.param_savings_pct, 1),
                "train time (s)": _num(r.train_time_s, 1),
                f"time savings vs {b} (%)": _num(r.time_savings_pct, 1),
                f"Δ dev vs {b} (pt) [95 % CI]": delta,
                "interval": r.delta_method if r.delta_method != "baseline" else "",
            }
        )
    return pd.DataFrame(out)


def _md_table(df: pd.DataFrame, right: Sequence[str] = ()) -> str:
    def esc(v) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(esc(c) for c in df.columns) + " |"]
    lines.append("|" + "|".join("--:" if c in right else "---" for c in df.columns) + "|")
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def markdown(report: Report, charts: bool = True) -> str:
    """``summary.md``: a table per dataset, how intervals were made, charts, runs left out."""
    src = report.source
    filters = ", ".join(f"{k}={v}" for k, v in src.items() if k not in ("uri", "experiment"))
    lines = [
        "# ablate comparison report",
        "",
        f"Experiment `{src.get('experiment')}` in `{src.get('uri')}`"
        + (f" ({filters})" if filters else "")
        + f": {len(report.runs)} runs used, {int((report.excluded.status != 'MISSING').sum())} "
        "left out. Every number is read from the runs' MLflow metrics.",
        "",
    ]
    for panel in report.summary.panel.unique():
        t = table(report, panel).drop(columns="dataset")
        numeric = [c for c in t.columns if c not in ("strategy", "interval")]
        lines += [f"## {panel}", "", _md_table(t, right=numeric), ""]
    lines += [
        "Metric values are the final model's (last epoch; with early stopping, the restored best "
        "epoch's), mean ± std over seeds. Train time is "
        "the time spent in training epochs (sum of `epoch_time_s`), without the dev evaluation "
        "after each epoch; the Trainer's runtime, which includes it, is `trainer_runtime_s` in "
        f"summary.csv. Δ vs `{report.baseline}` is paired by seed: a t-interval of the "
        "per-seed differences with 3 or more seeds, otherwise a percentile bootstrap over dev "
        f"items (words or sentences; {N_BOOT} resamples, fixed RNG seed) when the runs logged "
        "their dev predictions; "
        "that bootstrap covers the choice of dev sentences, not seed-to-seed variation (the ± std "
        "shows that): run 3 or more seeds for an interval over seeds.",
        "",
    ]
    if report.notes:
        lines += ["Notes:", "", *[f"- {n}" for n in report.notes], ""]
    if charts:
        lines += ["## Charts", ""] + [f"![{c}]({c}.png)" for c in CHARTS] + [""]
    lines += ["## Runs left out", ""]
    if report.excluded.empty:
        lines += ["None: every run found was used.", ""]
    else:
        ex = report.excluded.assign(
            run_name=report.excluded.run_name.fillna("–"), seed=report.excluded.seed.astype("Int64")
        )
        lines += [_md_table(ex.rename(columns={"freeze": "strategy"})), ""]
    return "\n".join(lines)


def default_out_dir() -> Path:
    """``reports/`` at the project root (ignored by git)."""
    return project_root() / "reports"


def write(report: Report, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Write ``summary.csv``, ``summary.md`` and one PNG per chart; return their paths by name."""
    import matplotlib.pyplot as plt

    from ablate import charts

    out = Path(out_dir) if out_dir else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    paths = {"summary.csv": out / "summary.csv", "summary.md": out / "summary.md"}
    report.summary.to_csv(paths["summary.csv"], index=False)
    for name in CHARTS:
        fig = getattr(charts, name)(report)
        paths[name] = out / f"{name}.png"
        fig.savefig(paths[name], dpi=120, bbox_inches="tight")
        plt.close(fig)
    paths["summary.md"].write_text(markdown(report), encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: read runs, write the report, print where it went and what was left out."""
    parser = argparse.ArgumentParser(
        prog="python -m ablate.report",
        description="Comparison report (summary.md, summary.csv, charts) from tracked MLflow runs.",
    )
    parser.add_argument("--uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or "
                        "sqlite:///<project>/mlflow.db)")  # fmt: skip
    parser.add_argument("--experiment", default="ablate", help="MLflow experiment name")
    parser.add_argument("--data", nargs="+", help="only these datasets (the `data` param)")
    parser.add_argument("--model", nargs="+", help="only these models (the `model` param)")
    parser.add_argument("--sweep", help="only runs of this multirun folder, or 'latest'")
    parser.add_argument("--status", nargs="+", help="only runs with these statuses")
    parser.add_argument("--metric", help="primary metric (default: from each run's data.task)")
    parser.add_argument("--baseline", default=BASELINE, help="strategy to compare against")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: reports/)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(
            args.experiment, args.uri, data=args.data, model=args.model, sweep=args.sweep,
            status=args.status, metric=args.metric,
        )  # fmt: skip
        report = build(runs, baseline=args.baseline)
        paths = write(report, args.out)
    except AblateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(p.name for p in paths.values())
    print(f"{len(report.runs)} runs used; wrote {names} to {paths['summary.md'].parent}")
    for r in report.excluded.itertuples():
        print(f"left out: {r.run_name or '-'} ({r.data}/{r.freeze}/s{r.seed}): {r.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
