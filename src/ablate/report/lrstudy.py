"""The lr study's table (``python -m ablate.lrstudy``): per study, its trials, those pruned and
the epochs that saved, and the best trial's lr and objective (``ablate.lrstudy.runs`` reads them
from the store)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ablate.archive import Archive, ArchivedRun
from ablate.lrstudy import pruned, trained_out
from ablate.lrstudy.runs import Best
from ablate.tables import markdown_table


def table(rows: Sequence[Best]) -> str:
    """The best lr per option as a markdown table."""
    cells = []
    for b in rows:
        trials = f"{b.trials}" + (
            f" (+{b.other_settings} with other settings, not compared)" if b.other_settings else ""
        )
        cells.append(
            (
                b.study.freeze,
                b.study.name,
                trials,
                str(b.pruned),
                str(b.epochs_saved),
                f"{b.lr:.3g}" if b.lr is not None else "-",
                b.study.metric,
                f"{b.value:.4f}" if b.value is not None else "-",
                b.run_id or "-",
            )
        )
    columns = [
        "freeze",
        "study",
        "finished",
        "pruned",
        "epochs saved",
        "best lr",
        "objective",
        "best value",
        "run",
    ]
    return markdown_table(cells, columns)


def pruning(archives: Mapping[str, Archive]) -> str:
    """What pruning cost and bought, per study: one row per (study, pruner) from archives of the
    same studies run with each pruner (``archives``: pruner name -> its trials' archive). Epochs
    are the machine-independent cost; wall time (the trials' runs, start to end) includes each
    trial's start-up and, for cached strategies, its frozen features, and depends on the load
    (the mean ``load_per_cpu`` beside it)."""
    cells = []
    for pruner, archive in archives.items():
        studies: dict[str, list[ArchivedRun]] = {}
        for run in archive.runs:
            if "study" in run.tags and run.tags.get("ablate.role") != "sweep":
                studies.setdefault(run.tags["study"], []).append(run)
        for name, runs in sorted(studies.items()):
            points = {r.run_id: _points(r) for r in runs}
            cut = [r for r in runs if pruned(r.tags)]
            done = [
                r
                for r in runs
                if trained_out(r.info["status"], r.tags) and points[r.run_id]["best"]
            ]
            top = max(done, key=lambda r: points[r.run_id]["best"][-1], default=None)
            loads = [v for p in points.values() for v in p["load_per_cpu"]]
            wall = sum((r.info["end_time"] - r.info["start_time"]) / 1000 for r in runs)
            cells.append(
                (
                    name,
                    pruner,
                    str(len(runs)),
                    str(len(cut)),
                    str(sum(len(p["epoch_time_s"]) for p in points.values())),
                    f"{wall:.0f}",
                    f"{sum(loads) / len(loads):.1f}" if loads else "-",
                    f"{float(top.params['trainer.lr']):.3g}" if top else "-",
                    f"{100 * points[top.run_id]['best'][-1]:.2f}" if top else "-",
                )
            )
    columns = [
        "study",
        "pruner",
        "trials",
        "pruned",
        "epochs trained",
        "trials' wall time (s)",
        "load per CPU",
        "best lr",
        "its dev (%)",
    ]
    return markdown_table(cells, columns, right=columns[2:])


def _points(run: ArchivedRun) -> dict[str, list[float]]:
    """A trial's values of the metrics ``pruning`` reads, in step order; ``best``: its
    objective (``best_dev_<primary metric>``)."""
    out: dict[str, list[float]] = {"epoch_time_s": [], "load_per_cpu": [], "best": []}
    for key, _step, _, value in sorted(run.metrics, key=lambda m: (m[0], m[1])):
        name = "best" if key.startswith("best_dev_") else key
        if name in out:
            out[name].append(value)
    return out
