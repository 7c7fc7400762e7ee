"""Sweeps side by side (``--sweep A --sweep B``): each sweep's runs read (``load_sweeps``) and
summarised as a report of its own, with its own baseline and groups of settings, its panels
named by its sweep (``label``); the reports then merged into one whose tables and charts show
each dataset's sweeps next to each other (``merge``), with a ``sweep`` column in its CSVs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ablate.config import default_tracking_uri
from ablate.report import scope
from ablate.report.load import Runs, _client, load_runs
from ablate.report.per_tag import PerTag
from ablate.tracking.store import all_runs


@dataclass
class Compared(Runs):
    """The runs of several sweeps: ``parts``, each sweep's own ``Runs`` by its label; the
    tables inherited hold them all, each run under each sweep it belongs to (``sweep``)."""

    parts: dict[str, Runs] = field(default_factory=dict)


def labels(folders: Sequence[str]) -> list[str]:
    """The shortest ending of each sweep's folder that tells it from the others' (Hydra's
    ``multirun/<day>/<time>``: the time, or the day and time where two days share a time)."""
    parts = [Path(f).parts for f in folders]
    for k in range(1, max(map(len, parts)) + 1):
        tails = ["/".join(p[-k:]) for p in parts]
        if len(set(tails)) == len(tails):
            return tails
    return list(folders)


def load_sweeps(
    experiment: str = "ablate", uri: str | None = None, sweeps: Sequence[str] = (), **filters
) -> Runs:
    """The runs of each of ``sweeps`` (multirun folders, or ``latest``), as ``load_runs`` reads
    one: a ``Compared`` where they are several sweeps (one named twice counts once), else that
    sweep's ``Runs``. A sweep without runs is one error naming each such and the sweeps that
    have runs, before anything else is read. ``filters``: the other ``load_runs`` filters."""
    uri = uri or default_tracking_uri()
    client, experiment_id = _client(uri, experiment)
    scope.check(all_runs(client, experiment_id), list(sweeps), experiment)
    read: dict[str, Runs] = {}
    for sweep in sweeps:
        runs = load_runs(experiment, uri, sweep=sweep, **filters)
        read.setdefault(runs.source["sweep"], runs)
    if len(read) == 1:
        return next(iter(read.values()))
    parts = dict(zip(labels(list(read)), read.values(), strict=True))
    first = next(iter(parts.values()))
    source = {k: v for k, v in first.source.items() if k not in ("sweep", "parent")}
    source["sweeps"] = "; ".join(f"{label} ({p.source['sweep']})" for label, p in parts.items())
    history = pd.concat([p.history for p in parts.values()], ignore_index=True)
    return Compared(
        runs=pd.concat(
            [p.runs.assign(sweep=label) for label, p in parts.items()], ignore_index=True
        ),
        history=history.drop_duplicates(["run_id", "key", "epoch"], ignore_index=True),
        params={k: v for p in parts.values() for k, v in p.params.items()},
        source=source,
        unrun=[{**u, "sweep": label} for label, p in parts.items() for u in p.unrun],
        parts=parts,
    )


def merge(reports: dict, source: dict[str, str]):
    """One report of each sweep's (``reports``, by label): a dataset's (and model's) panels of
    every sweep next to each other, in the sweeps' order; a ``sweep`` column in its tables."""
    first = next(iter(reports.values()))

    def joined(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
        tagged = [f.assign(sweep=label) for label, f in frames.items()]
        out = pd.concat(tagged, ignore_index=True)
        return out[["sweep", *out.columns.drop("sweep")]]

    summary = joined({k: r.summary for k, r in reports.items()})
    # a dataset's panels side by side: ordered by where the dataset first shows, then by sweep
    where = summary[["data", "model"]].apply(tuple, axis=1)
    summary = summary.iloc[where.map({k: i for i, k in enumerate(where.unique())}).argsort(
        kind="stable")].reset_index(drop=True)  # fmt: skip
    tagged = [r.per_tag for r in reports.values() if r.per_tag is not None]
    per_tag = None
    if tagged:
        per_tag = PerTag(
            joined({k: r.per_tag.table for k, r in reports.items() if r.per_tag is not None}),
            {k: v for pt in tagged for k, v in pt.confusion.items()},
            [x for pt in tagged for x in pt.lacking],
        )
    return dataclasses.replace(
        first,
        summary=summary,
        runs=joined({k: r.runs for k, r in reports.items()}),
        history=pd.concat([r.history for r in reports.values()], ignore_index=True),
        excluded=joined({k: r.excluded for k, r in reports.items()}),
        notes=[n for r in reports.values() for n in r.notes],
        source=source,
        per_tag=per_tag,
    )
