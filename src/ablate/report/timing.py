"""Whether a report's times compare: runs timed beside other work (``loaded``), on other
machines, with seeds far apart in time or CPUs probed at different speeds; the notes that say so."""

from __future__ import annotations

import math

import pandas as pd

from ablate.training.resources import PASSIVE_FROM

# A run whose machine had more than this many runnable threads per usable CPU at the end of an
# epoch shared its cores: its times are not comparable with an idle machine's.
LOADED = 1.25
# A strategy whose slowest counted seed trained more than this many times as long as its fastest,
# or runs whose CPU speed probes lie more than this far apart, ran on machines of changing speed
# (a virtual machine's shared host): their times, and savings from them, are uncertain by as much.
SPREAD = 1.25


def busy_cpus(df: pd.DataFrame) -> pd.Series:
    """Which runs (or summary rows) had more than ``LOADED`` runnable threads per CPU at an
    epoch's end. Not recorded counts as not busy."""
    return df.load_per_cpu > LOADED


def busy_at_start(df: pd.DataFrame) -> pd.Series:
    """Which runs started while other work kept CPUs busy: OpenMP then waits passively for the
    whole run (``trainer.omp_wait_policy=auto``), which slows it on the machine it has to itself
    afterwards (small kernels most: a BiLSTM head's epochs 3-4x)."""
    return df.busy_cpus_at_start >= PASSIVE_FROM


def shared_gpu(df: pd.DataFrame) -> pd.Series:
    """Which runs shared their GPU with other jobs of their sweep (``jobs_on_gpu``)."""
    return df.jobs_on_gpu > 1


def loaded(df: pd.DataFrame) -> pd.Series:
    """Which runs (or summary rows) were timed beside other work: ``busy_cpus``,
    ``busy_at_start`` or ``shared_gpu``."""
    return busy_cpus(df) | busy_at_start(df) | shared_gpu(df)


def machines(df: pd.DataFrame) -> pd.Series:
    """The CPU each run trained on (``not recorded`` for a run from before runs recorded it)."""
    return df.cpu.fillna("not recorded")


def savings_loaded(summary: pd.DataFrame) -> pd.Series:
    """Which summary rows' time savings rest on a time measured beside other work: their own
    (``loaded``), or their panel's baseline's."""
    busy = loaded(summary)
    return busy | _baselines(summary, busy).fillna(False).astype(bool)


def savings_spread(summary: pd.DataFrame) -> pd.Series:
    """How far apart the times behind each summary row's time saving may lie: the largest of
    its own and its panel's baseline's ``train_time_spread`` (slowest / fastest seed) and its
    ``speed_spread`` (fastest / slowest CPU speed probe of its and the baseline's runs); NaN
    where none is known."""
    spread = pd.to_numeric(summary.train_time_spread)
    speed = pd.to_numeric(summary.get("speed_spread", pd.Series(index=summary.index)))
    base_spread = pd.to_numeric(_baselines(summary, spread))
    return pd.concat([spread, base_spread, speed], axis=1).max(axis=1)


def _baselines(summary: pd.DataFrame, values: pd.Series) -> pd.Series:
    """For each summary row, ``values``' entry of its panel's baseline row (NaN where none)."""
    base = summary.delta_method == "baseline"
    return summary.panel.map(dict(zip(summary.panel[base], values[base], strict=True)))


def speeds_said(group: pd.DataFrame, order: list[str]) -> str:
    """A panel's runs' CPU speed probes (GFLOP/s) by strategy in ``order``, where they lie more
    than ``SPREAD`` apart or only some runs recorded one; empty otherwise. A strategy's runs
    timed beside other work count only where all its runs were (as for its time)."""
    timed = {s: unloaded(group[group.freeze == s]).cpu_gflops.dropna() for s in order}
    if not probe_spread(list(timed.values())) > SPREAD:
        return ""
    ranges = [(s, v.min(), v.max()) for s, v in timed.items() if len(v)]
    said = ", ".join(
        f"{s} {lo:.0f}" + (f"-{hi:.0f}" if hi >= lo + 0.5 else "") for s, lo, hi in ranges
    )
    said += " GFLOP/s"
    unknown = [s for s, values in timed.items() if values.empty]
    return f"{said}; not recorded: {', '.join(unknown)}" if unknown else said


def probe_spread(sides: list[pd.Series]) -> float:
    """Fastest / slowest CPU speed probe (``cpu_gflops``) over ``sides`` (each: some runs'
    probes): inf where some side recorded none while another did (its speed unknown), NaN
    where none did."""
    known = [side.dropna() for side in sides]
    probes = pd.concat(known)
    if probes.empty:
        return math.nan
    if any(side.empty for side in known):
        return math.inf
    return probes.max() / probes.min()


def spread_said(rows: list[dict]) -> str:
    """The strategies among summary ``rows`` whose seeds' train times spread beyond ``SPREAD``,
    each with its spread; empty where none does."""
    wide = [r for r in rows if r["train_time_spread"] > SPREAD]
    return ", ".join(f"{r['strategy']} {r['train_time_spread']:.2f}x" for r in wide)


def unloaded(cell: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``cell`` whose times count: those not timed beside other work (``loaded``),
    or all of them when every one was."""
    calm = cell[~loaded(cell)]
    return calm if len(calm) else cell


def _machines(group: pd.DataFrame, order: list[str]) -> str:
    """The CPUs a panel's runs trained on, each with its strategies, where there are several
    (a run from before runs recorded theirs: not recorded); empty where all ran on one."""
    cpu = machines(group)
    if cpu.nunique() < 2:
        return ""
    return "; ".join(
        f"{name}: {', '.join(s for s in order if s in set(group.freeze[cpu == name]))}"
        for name in sorted(cpu.unique())
    )


def _load_said(busy: pd.DataFrame) -> str:
    """How loaded ``busy``'s runs were: their machine's threads per CPU, their GPU's jobs."""
    said = []
    if busy_cpus(busy).any():
        said.append(f"up to {busy.load_per_cpu.max():.1f} runnable threads per CPU")
    if busy_at_start(busy).any():
        said.append(
            f"other work keeping up to {busy.busy_cpus_at_start.max():.1f} CPUs busy at a run's "
            "start (its OpenMP then waited passively throughout)"
        )
    if shared_gpu(busy).any():
        said.append(f"up to {busy.jobs_on_gpu.max():.0f} jobs sharing a GPU")
    return ", ".join(said)


def time_notes(panel: str, group: pd.DataFrame, rows: list[dict], order: list[str]) -> list[str]:
    """The report's notes on whether ``panel``'s times compare (``group``: its runs; ``rows``:
    the summary rows so far; ``order``: its strategies in the report's order)."""
    notes = []
    busy = group[loaded(group)]
    if len(busy):
        which = ", ".join(f"{r.freeze} seed {r.seed}" for r in busy.itertuples())
        notes.append(
            f"{panel}: runs measured on a loaded machine ({_load_said(busy)}): {which}. "
            f"Their accuracy counts; their times count only where every seed of the strategy "
            f"was loaded, and are marked *: compare those with care."
        )
    if machines := _machines(group, order):
        notes.append(
            f"{panel}: its runs trained on different machines ({machines}): train times and "
            f"their savings compare only between runs on one machine."
        )
    if spread := spread_said([r for r in rows if r["panel"] == panel]):
        notes.append(
            f"{panel}: seeds of a strategy trained more than {SPREAD:g}x apart in time "
            f"(slowest / fastest: {spread}): the machine's speed changed between runs, so "
            f"those times and their savings are uncertain by about as much."
        )
    if speeds := speeds_said(group, order):
        notes.append(
            f"{panel}: its runs' CPUs ran at different speeds, or not all recorded theirs "
            f"(a matrix-product probe after each epoch: {speeds}): train times and their "
            f"savings compare only between runs of like speed."
        )
    return notes
