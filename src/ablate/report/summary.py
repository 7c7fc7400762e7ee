"""The comparison: a summary row per dataset (and model) x strategy with intervals vs the ``none``
baseline, and every run left out with the reason (``build``).

Runs are compared only under equal settings: every param but the seed and the keys the schema
marks as not a setting (``ablate.config.key``: paths, thread counts, speed switches that change no
result beyond seed noise, from ``ablate.switches``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from ablate import strategies
from ablate.config import default_tracking_uri
from ablate.errors import AblateError
from ablate.report import chance, recipe, sweeps
from ablate.report.cell import LR_FROM_STUDY as LR_FROM_STUDY  # where the docs read it
from ablate.report.cell import summary_row
from ablate.report.delta import adjust, disagreements
from ablate.report.load import Runs, describe_source, load_runs
from ablate.report.per_tag import PerTag, per_tag
from ablate.report.stats import N_BOOT, Predictions
from ablate.report.timing import time_notes
from ablate.tracking.params import option_keys, settings

BASELINE = "none"
# The freeze options in the order their strategies declare them (``ablate.strategies``): full
# fine-tuning first, then from least to most frozen, then the parameter-efficient methods.
STRATEGY_ORDER = strategies.report_order()
_EXCLUDED_COLUMNS = ["run_name", "data", "model", "freeze", "seed", "status", "reason"]


def strategy_order(names: Iterable[str]) -> list[str]:
    """``names`` in the report's order: the strategies' (an extension's too) first, any others
    alphabetically."""
    names, order = set(names), strategies.report_order()
    return [s for s in order if s in names] + sorted(names - set(order))


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
    per_tag: PerTag | None = None  # a word-tagging task's per-tag accuracy and confusions


def own_keys(freeze: str, recorded: object) -> frozenset[str]:
    """The keys outside ``freeze.*`` that a run's strategy brings (a ``features`` run's head
    differs from the others' by design, a peft method sets its own lr): as the run recorded them
    when it ran (``recorded``, its tag), else (a run made before runs recorded them) as today's
    ``conf/`` composes its option."""
    if isinstance(recorded, str):
        return frozenset(filter(None, recorded.split(",")))
    return option_keys(freeze)


def compared(params: dict[str, str], own: frozenset[str], recipe_lr: str | None) -> dict[str, str]:
    """A run's settings as compared with the runs of other strategies: without the keys that
    are its strategy's own (``freeze.*`` and ``own``, from ``own_keys``), which match any value,
    and with the recipe's lr where the run's own lr study picked the lr (``recipe_lr``), unless
    the lr is its strategy's own (a peft method's option sets its default lr)."""
    out = {
        k: v for k, v in settings(params).items() if not k.startswith("freeze.") and k not in own
    }
    if isinstance(recipe_lr, str) and "trainer.lr" not in own:
        out["trainer.lr"] = recipe_lr
    return out


@dataclass
class _Group:
    """Runs of equal settings: their ``compared`` settings merged, the keys their strategies own
    (a key no member has a value for matches any), and the sweeps they ran in."""

    values: dict[str, str]
    owned: set[str]
    sweeps: set

    def matches(self, values: dict[str, str], own: frozenset[str]) -> bool:
        """Whether a run's ``compared`` settings agree with the group's on every key but those
        its strategy owns and those only owners in the group lack (a key logged by one side
        only, a dict param's entry say, is a difference)."""
        for key in values.keys() | self.values.keys():
            if key in own or (key not in self.values and key in self.owned):
                continue
            if values.get(key) != self.values.get(key):
                return False
        return True


def _groups(ok: pd.DataFrame, params: dict[str, dict[str, str]]) -> tuple[dict, dict]:
    """The runs' groups of equal settings: each run's group's settings (``compared``, the keys a
    strategy owns filled in by the group's other runs), and the runs that fit several groups,
    with the reason. The strategies that own no key form the groups first; a run whose strategy
    owns a key then joins the one group that agrees with it on every other key, or where several
    do, the one that holds runs of its own sweep."""
    own = {r.run_id: own_keys(r.freeze, r.option_keys) for r in ok.itertuples()}
    sweep = dict(zip(ok.run_id, ok.sweep_dir, strict=True))
    mine = {
        r.run_id: compared(params[r.run_id], own[r.run_id], r.recipe_lr) for r in ok.itertuples()
    }
    groups: list[_Group] = []
    member: dict[str, _Group] = {}
    ambiguous: dict[str, str] = {}
    for run_id in sorted(mine, key=lambda r: bool(own[r])):  # stable: in start order within
        fits = [g for g in groups if g.matches(mine[run_id], own[run_id])]
        if len(fits) > 1:
            same = [g for g in fits if isinstance(sweep[run_id], str) and sweep[run_id] in g.sweeps]
            if len(same) != 1:
                apart = _group_labels({str(i): g.values for i, g in enumerate(fits)}).values()
                ambiguous[run_id] = (
                    f"fits {len(fits)} groups of settings ({'; '.join(apart)}), none by its own "
                    f"sweep: its option sets {', '.join(sorted(own[run_id]))} itself; report "
                    "each group apart (--sweep DIR, or another experiment)"
                )
                continue
            fits = same
        if not fits:
            groups.append(_Group({}, set(), set()))
        group = member[run_id] = fits[0] if fits else groups[-1]
        group.values.update(mine[run_id])
        group.owned |= own[run_id]
        group.sweeps.add(sweep[run_id])
    return {r: g.values for r, g in member.items()}, ambiguous


def _diff(a: dict[str, str], b: dict[str, str]) -> str:
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return ", ".join(f"{k}={a.get(k, '-')} (latest: {b.get(k, '-')})" for k in keys)


def _group_labels(shared: dict[str, dict[str, str]]) -> dict[str, str]:
    """A label per group of settings: the values of the keys in which the groups differ."""
    groups = list(dict.fromkeys(json.dumps(s, sort_keys=True) for s in shared.values()))
    if len(groups) < 2:
        return dict.fromkeys(groups, "")
    decoded = [json.loads(g) for g in groups]
    keys = sorted({k for g in decoded for k in g if len({d.get(k) for d in decoded}) > 1})
    return {
        g: ", ".join(f"{k.rsplit('.', 1)[-1]}={d.get(k, '-')}" for k in keys)
        for g, d in zip(groups, decoded, strict=True)
    }


def _select(runs: Runs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split runs into the ones a summary uses and the ones left out, with the reason; the used
    ones carry their group of settings (``group``: a label, empty when there is one group)."""
    df = runs.runs.sort_values("start_time", kind="stable", ignore_index=True)
    reasons: dict[str, str] = {}
    ident = df[["data", "model", "freeze"]].notna().all(axis=1) & df.seed.notna()
    for row in df[~ident].itertuples():
        reasons[row.run_id] = "not an ablate training run (no data/model/freeze/seed params)"
    for row in df[ident & df.study.notna()].itertuples():  # its lr is what it varies, not a cell
        reasons[row.run_id] = f"a trial of the lr study {row.study}, not a grid's run"
    for row in df[ident & (df.status != "FINISHED")].itertuples():
        why = f": {row.error}" if isinstance(row.error, str) else ""
        reasons[row.run_id] = f"{row.status}{why}"
    for row in df[ident & (df.status == "FINISHED") & df.dev.isna()].itertuples():
        reasons[row.run_id] = f"no dev_{row.metric} logged"

    # Runs are compared only within a group of equal settings (every setting but the seed and
    # the strategy's own keys): one table per group, never a mean across groups.
    ok = df[~df.run_id.isin(reasons)]
    shared, ambiguous = _groups(ok, runs.params)
    reasons.update(ambiguous)
    # groups told apart within a dataset and model: those differ between panels anyway
    labels = {
        (data, model, g): label
        for (data, model), part in ok[ok.run_id.isin(shared)].groupby(["data", "model"])
        for g, label in _group_labels({r: shared[r] for r in part.run_id}).items()
    }
    df["group"] = [
        labels.get((r.data, r.model, json.dumps(shared.get(r.run_id), sort_keys=True)))
        for r in df.itertuples()
    ]
    df["compared"] = [shared.get(r) for r in df.run_id]
    ok = df[~df.run_id.isin(reasons)]
    # Within a group, the seeds of one strategy also share its own keys; the latest run decides
    # (a variant under the same name, freeze.embeddings=true say, is not one of its seeds).
    for _, cell in ok.groupby(["group", "data", "model", "freeze"]):
        latest = settings(runs.params[cell.run_id.iloc[-1]])
        for row in cell.itertuples():
            diff = _diff(settings(runs.params[row.run_id]), latest)
            if diff:
                reasons[row.run_id] = f"other settings than the latest {row.freeze} run: {diff}"
    ok = df[~df.run_id.isin(reasons)]
    for _, cell in ok.groupby(["group", "data", "model", "freeze", "seed"]):
        for row in cell.iloc[:-1].itertuples():
            reasons[row.run_id] = f"superseded by the later run {cell.run_id.iloc[-1]}"

    used = df[~df.run_id.isin(reasons)].reset_index(drop=True)
    left = df[df.run_id.isin(reasons)].assign(reason=lambda d: d.run_id.map(reasons))
    left = left[_EXCLUDED_COLUMNS]

    # A strategy x seed that a grid implies (seeds used in its panel, strategies seen in it) but
    # for which no run exists at all.
    missing = []
    for (group, data, model), panel in used.groupby(["group", "data", "model"]):
        seeds = set(panel.seed.dropna())
        tried = df[ident & (df.data == data) & (df.model == model)]
        tried = tried[tried.group.isna() | (tried.group == group)]
        for strategy in strategy_order(tried.freeze):
            have = set(tried[tried.freeze == strategy].seed)
            for seed in sorted(seeds - have):
                missing.append((None, data, model, strategy, seed, "MISSING", "no run logged"))
    # the jobs of the sweep's grid without a run, but those a strategy x seed above names
    missing = [dict(zip(_EXCLUDED_COLUMNS, m, strict=True)) for m in missing]
    named = {(m["freeze"], m["seed"]) for m in missing}
    missing += [r for r in runs.unrun if (r["freeze"], r["seed"]) not in named]
    left = pd.concat([left, pd.DataFrame(missing, columns=_EXCLUDED_COLUMNS)], ignore_index=True)
    return used, left


def _panels(df: pd.DataFrame, sweep: str = "") -> pd.Series:
    """A panel per dataset (and model, and the sweep where a report compares several, and group
    of settings, when there are several)."""
    many_models = df.groupby("data").model.nunique().gt(1).any() if len(df) else False
    panel = df.data + " · " + df.model if many_models else df.data.copy()
    panel = panel + f" · {sweep}" if sweep else panel
    grouped = df.group.fillna("") != ""
    return panel.where(~grouped, panel + " · " + df.group.fillna(""))


_SUMMARY_COLUMNS = [
    "panel", "data", "model", "settings", "strategy", "metric", "n", "seeds", "lr", "lr_from",
    "lr_interior",
    "dev_mean_pct", "dev_std_pct", "dev_ci_low_pct", "dev_ci_high_pct", "dev_ci_method",
    "best_dev_mean_pct", "test_mean_pct", "test_std_pct", "chance_pct", "at_chance",
    "trainable_params_m", "total_params_m", "param_savings_pct",
    "train_time_s", "train_time_s_std", "train_time_spread", "timed_seeds", "time_savings_pct",
    "trainer_runtime_s", "cpu_gflops", "speed_spread",
    "wall_s", "peak_rss_mb", "peak_rss_carried", "train_flops", "load_per_cpu",
    "jobs_on_gpu", "busy_cpus_at_start",
    "delta_dev_pt", "delta_ci_low_pt", "delta_ci_high_pt", "delta_method",
    "delta_dev_p", "delta_dev_p_holm",
    "delta_test_pt", "delta_test_ci_low_pt", "delta_test_ci_high_pt", "delta_test_method",
    "delta_test_p", "delta_test_p_holm",
    "mcnemar_tested", "mcnemar_seeds", "mcnemar_discordant", "mcnemar_method", "mcnemar_p",
    "mcnemar_p_holm",
]  # fmt: skip


def build(
    runs: Runs,
    *,
    baseline: str = BASELINE,
    n_boot: int = N_BOOT,
    boot_seed: int = 0,
    predictions: bool = True,
    sweep: str = "",
) -> Report:
    """Summarise ``runs``: one row per dataset (and model) x strategy, in ``STRATEGY_ORDER``.

    Only FINISHED runs with the primary metric count; the latest run per strategy x seed is used;
    everything else is listed in ``excluded`` with the reason. Δ vs ``baseline``, on dev and on
    test, pairs runs by seed: a t-interval of the per-seed differences with >= 3 seeds, else a
    bootstrap over the split's items (words or sentences; ``n_boot`` resamples, RNG seed
    ``boot_seed``) when its predictions were logged; McNemar's test per seed on test items; each
    panel's p-values Holm-adjusted across its comparisons (``delta``). A word-tagging task's
    panels get per-tag accuracies and confusions from the runs' predictions (``per_tag``).
    Several sweeps' runs (``sweeps.Compared``) are each summarised so, their panels named by
    their sweep (``sweep``), then side by side (``sweeps.merge``).
    """
    if isinstance(runs, sweeps.Compared):
        kwargs = {"baseline": baseline, "n_boot": n_boot, "boot_seed": boot_seed}
        parts = {label: build(part, **kwargs, predictions=predictions, sweep=label)
                 for label, part in runs.parts.items()}  # fmt: skip
        return sweeps.merge(parts, runs.source)
    used, excluded = _select(runs)
    if used.empty:
        raise AblateError(_unusable(runs, excluded))
    used = used.assign(panel=_panels(used, sweep))
    named = used.groupby("data").model.nunique().le(1).all()  # the panels don't name the model
    preds = Predictions(runs.source.get("uri", default_tracking_uri()), predictions)
    boot = {"n_boot": n_boot, "seed": boot_seed}
    rows, notes = [], []
    for (panel, data, model), group in used.groupby(["panel", "data", "model"], sort=True):
        first = group.iloc[0]
        described = recipe.describe(first.compared, data, model, name_model=named)
        base = group[group.freeze == baseline]
        if base.empty:
            notes.append(f"{panel}: no `{baseline}` run, so no savings or Δ vs baseline.")
        panel_rows, level = [], chance.level(group, preds)
        for strategy in strategy_order(group.freeze):
            cell = group[group.freeze == strategy].sort_values("seed")
            metric = cell.metric.iloc[0]
            head = {
                "panel": panel,
                "data": data,
                "model": model,
                "settings": described,
                "strategy": strategy,
            }
            row = {**head, "metric": metric, **summary_row(cell, base, preds, boot)}
            row.update(chance_pct=level, at_chance=chance.at_chance(row["dev_mean_pct"], level))
            panel_rows.append(row)
        adjust(panel_rows)  # the family: this panel's comparisons with the baseline
        rows += panel_rows
        notes += [f"{panel}: {said}" for said in disagreements(panel_rows)]
        notes += chance.notes(panel, panel_rows)
        if differ := _differing_settings(group, runs.params):
            notes.append(f"{panel}: strategies were run with different settings: {differ}.")
        notes += time_notes(panel, group, rows, strategy_order(group.freeze))
        counts = group.groupby("freeze").size()
        if counts.nunique() > 1:
            notes.append(f"{panel}: strategies have different numbers of seeds: {_counts(counts)}.")
        if counts.max() == 1:
            notes.append(
                f"{panel}: one seed per strategy, so no spread over seeds (no ± std, no seed-level "
                f"intervals); intervals, where shown, are bootstraps over dev "
                f"{group['items'].iloc[0]}."
            )
    summary = pd.DataFrame(rows).reindex(columns=_SUMMARY_COLUMNS)
    tagged = per_tag(summary, used, preds, baseline) if predictions else None
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
        per_tag=tagged,
    )


def _unusable(runs: Runs, excluded: pd.DataFrame) -> str:
    """Why a report has no run to use, in one line, with the flags that choose other runs."""
    shown = 4
    listed = [
        f"{r.run_name or r.freeze}: {' '.join(str(r.reason).split())[:200]}"
        for r in excluded[excluded.status != "MISSING"].itertuples()
    ]
    more = f"; and {len(listed) - shown} more" if len(listed) > shown else ""
    why = f" ({'; '.join(listed[:shown])}{more})" if listed else ": it holds no run"
    return (
        f"no usable runs in {describe_source(runs.source)}{why}; choose other runs with "
        "--sweep DIR (another sweep), --all (every run of the experiment), --experiment, "
        "or other --data/--model/--status"
    )


def _differing_settings(group: pd.DataFrame, params: dict[str, dict[str, str]]) -> str:
    """Settings that differ between the strategies of one panel, e.g. runs from two grids; each
    strategy's own keys (``compared``) differ by design and are not named."""
    latest = {s: group[group.freeze == s].iloc[-1] for s in strategy_order(group.freeze)}
    own = {s: own_keys(r.freeze, r.option_keys) for s, r in latest.items()}
    by_strategy = {s: compared(params[r.run_id], own[s], r.recipe_lr) for s, r in latest.items()}
    keys = {k for p in by_strategy.values() for k in p}
    parts = []
    for key in sorted(keys):
        values = {s: p.get(key, "-") for s, p in by_strategy.items() if key not in own[s]}
        if len(set(values.values())) > 1:
            parts.append(f"{key} ({', '.join(f'{s}: {v}' for s, v in values.items())})")
    return "; ".join(parts)


def _counts(counts: pd.Series) -> str:
    return ", ".join(f"{s}: {counts[s]}" for s in strategy_order(counts.index))


def make_report(experiment: str = "ablate", uri: str | None = None, **filters) -> Report:
    """``build(load_runs(experiment, uri, **filters))``."""
    return build(load_runs(experiment, uri, **filters))
