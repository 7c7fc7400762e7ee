"""Which runs a report covers: a sweep's (its parent run's children and the FINISHED runs it
reused instead of running their jobs again), the latest sweep that has any, the jobs of a
sweep's grid that have no run in it (``unrun``), and, for an error, what the store holds
instead, so that the message can name the flag that fixes it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ablate.errors import AblateError
from ablate.tracking.parent import GRID, MOVED, REUSED

SHOWN = 3  # sweeps named in an error message


class NoSweep(AblateError):
    """The experiment holds no sweep that has runs."""


@dataclass(frozen=True)
class Sweep:
    """A ``--multirun``'s parent run and the ids of its runs (children and reused runs)."""

    run_id: str
    folder: str | None
    start_time: int
    runs: frozenset[str]

    def describe(self) -> str:
        """``<folder> (<n> runs, started <when> UTC)``."""
        when = pd.to_datetime(self.start_time, unit="ms").strftime("%Y-%m-%d %H:%M")
        n = len(self.runs)
        return f"{self.folder or self.run_id} ({n} run{'s' if n != 1 else ''}, started {when} UTC)"


def is_sweep(run) -> bool:
    """Whether ``run`` is a sweep's parent run (no training run)."""
    return run.data.tags.get("ablate.role") == "sweep"


def reused(tags: dict[str, str]) -> list[str]:
    """The run ids a sweep's parent run reused, by job number."""
    jobs = {k.removeprefix(REUSED): v for k, v in tags.items() if k.startswith(REUSED)}
    return [run_id for _, run_id in sorted(jobs.items(), key=lambda job: job[0].zfill(9))]


def members(found: list, run_id: str) -> set[str]:
    """The runs of the sweep whose parent run is ``run_id``: its children and the runs its tags
    name as reused."""
    ids = {r.info.run_id for r in found if r.data.tags.get("mlflow.parentRunId") == run_id}
    parent = next((r for r in found if r.info.run_id == run_id), None)
    return ids | set(reused(parent.data.tags) if parent is not None else ())


def sweeps(found: list) -> list[Sweep]:
    """Every sweep of ``found`` (the runs of an experiment), newest first."""
    children: dict[str, set[str]] = {}
    for r in found:
        if (parent := r.data.tags.get("mlflow.parentRunId")) is not None:
            children.setdefault(parent, set()).add(r.info.run_id)
    out = [
        Sweep(
            r.info.run_id,
            r.data.tags.get("hydra.sweep_dir"),
            r.info.start_time,
            frozenset(children.get(r.info.run_id, set()) | set(reused(r.data.tags))),
        )
        for r in found
        if is_sweep(r)
    ]
    return sorted(out, key=lambda s: s.start_time, reverse=True)


def with_runs(found: list) -> list[Sweep]:
    """The sweeps that have runs, newest first (a sweep whose every job failed before its run
    opened, a typo say, has none)."""
    return [s for s in sweeps(found) if s.runs]


def listing(found: list) -> str:
    """The latest sweeps that have runs, for an error message: ``--sweep`` takes their folder."""
    have = with_runs(found)
    if not have:
        return "it holds no sweep with runs"
    more = f" and {len(have) - SHOWN} older" if len(have) > SHOWN else ""
    return "its latest sweeps with runs: " + "; ".join(s.describe() for s in have[:SHOWN]) + more


def select(found: list, sweep: str, experiment: str) -> tuple[set[str], str | None, list[str]]:
    """The run ids of ``sweep`` (a multirun folder, or ``latest``: the newest sweep that has
    runs), its folder, and its parent runs' ids.

    A folder's sweeps are every sweep run there (a sweep started again in it) and the runs
    tagged with it by versions that opened no parent run."""
    ids, folder, parents, why = _find(found, sweep, experiment)
    if why:
        raise _unknown(found, [why], experiment)
    return ids, folder, parents


def check(found: list, asked: list[str], experiment: str) -> None:
    """Nothing where every sweep ``asked`` has runs, else one error naming each that has none
    and the sweeps that have some."""
    said = [why for sweep in asked if (why := _find(found, sweep, experiment)[3])]
    if said:
        raise _unknown(found, said, experiment)


def _unknown(found: list, said: list[str], experiment: str) -> AblateError:
    return AblateError(
        f"{'; '.join(said)} (experiment {experiment!r}); "
        f"{listing(found)}: pass one of their folders to --sweep, or --all for every run"
    )


def _find(found: list, sweep: str, experiment: str) -> tuple[set[str], str, list[str], str]:
    """``select``'s run ids, folder and parent runs of ``sweep``, and where it has no runs, why
    (``--sweep <it>: <why>``; else empty)."""
    if sweep == "latest":
        have = with_runs(found)
        if have:
            return set(have[0].runs), have[0].folder, [have[0].run_id], ""
        tagged = [r for r in found if "hydra.sweep_dir" in r.data.tags and not is_sweep(r)]
        if not tagged:
            empty = len(sweeps(found))
            why = f" ({empty} ran no job)" if empty else ""
            raise NoSweep(
                f"no sweep (a --multirun) with runs in experiment {experiment!r}{why}; "
                "--all reports every run"
            )
        sweep = max(tagged, key=lambda r: r.info.start_time).data.tags["hydra.sweep_dir"]
    folder = str(Path(sweep).expanduser().resolve())
    here = [s for s in sweeps(found) if s.folder == folder]
    ids = set().union(*(s.runs for s in here))
    ids |= {
        r.info.run_id
        for r in found
        if r.data.tags.get("hydra.sweep_dir") == folder and not is_sweep(r)
    }
    why = ""
    if not ids:
        why = (
            f"the sweeps run in {folder} have no runs ({_gone(found, here)})"
            if here
            else f"no sweep ran in {folder}"
        )
        why = f"--sweep {sweep}: {why}"
    return ids, folder, [s.run_id for s in reversed(here)], why


def _gone(found: list, here: list[Sweep]) -> str:
    """Why sweeps have no runs: later sweeps resumed them (named), or no job opened one."""
    ids = {s.run_id for s in here}
    later = {
        r.data.tags.get("mlflow.parentRunId")
        for r in found
        if any(m["sweep"] in ids for m in json.loads(r.data.tags.get(MOVED, "[]")))
    }
    folders = sorted(s.folder or s.run_id for s in sweeps(found) if s.run_id in later)
    if folders:
        return f"later sweeps resumed their runs: {', '.join(folders)}"
    return "every job failed before its run opened"


def unrun(found: list, parents: list[str]) -> list[dict]:
    """The jobs of the grids of the sweeps ``parents`` that have no run in them, each once
    (a grid run twice in one folder: a job with a run in either has one), as ``{"sweep": its
    run, "job", "overrides": the ones it has of its own, "reason"}``; sweeps that recorded no
    grid (an lr study's, older versions') have none. ``found``: the experiment's runs."""
    by_id = {r.info.run_id: r for r in found}
    have: dict[str, set[int]] = {}
    for r in found:
        parent, num = r.data.tags.get("mlflow.parentRunId"), r.data.tags.get("hydra.job_num")
        if parent in parents and num is not None and num.isdigit():
            have.setdefault(parent, set()).add(int(num))
    missing, covered = [], set()
    for sweep in (by_id[p] for p in parents if p in by_id and GRID in by_id[p].data.tags):
        grid = json.loads(sweep.data.tags[GRID])
        labels = grid.get("jobs") or [""] * grid["n"]
        jobs = have.get(sweep.info.run_id, set())
        jobs |= {int(k.removeprefix(REUSED)) for k in sweep.data.tags if k.startswith(REUSED)}
        covered |= {labels[n] for n in jobs if n < grid["n"] and labels[n]}
        missing += [(sweep, n, labels[n]) for n in range(grid["n"]) if n not in jobs]
    rows, seen = [], set()
    for sweep, n, label in missing:
        key = label or (sweep.info.run_id, n)
        if key not in covered and key not in seen:
            seen.add(key)
            rows.append(
                {"sweep": sweep, "job": n, "overrides": label, "reason": _why(found, sweep, n)}
            )
    return rows


def _why(found: list, sweep, job: int) -> str:
    """Why a job of ``sweep`` has no run in it: a later sweep resumed its run, or it never
    opened one."""
    here = {"sweep": sweep.info.run_id, "job": str(job)}
    for r in found:
        if here in json.loads(r.data.tags.get(MOVED, "[]")):
            later = r.data.tags.get("mlflow.parentRunId")
            now = next((s for s in found if s.info.run_id == later), None)
            where = f" in {now.data.tags.get('hydra.sweep_dir')}" if now is not None else ""
            name = r.info.run_name
            return f"its run {name} was resumed by the later sweep{where}, whose report has it"
    return "no run in this sweep: the job did not start, or failed before its run opened"
