"""The generated blocks about a published study's lr studies (``docs/results/<study>/``): its
trials per pruner and per strategy, read from the archives beside its page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ablate.docs.studies import ARCHIVE, PARTIAL, NoResults, current_runs, study_dir
from ablate.tables import code, markdown_table

if TYPE_CHECKING:
    from ablate.archive import Archive, ArchivedRun

PRUNING = "pruning"  # docs/results/<study>/pruning/<pruner>/: its lr studies' trials, archived


def lr_pruning(study: str) -> str:
    """Per lr study of ``study``, what pruning cost and bought: its trials run with each pruner,
    read from the archives in ``docs/results/<study>/pruning/<pruner>/``."""
    from ablate.archive import read

    found = sorted(p for p in (study_dir(study) / PRUNING).glob("*") if p.is_dir())
    if not found:
        raise NoResults(f"_No lr studies archived yet under `docs/results/{study}/{PRUNING}/`._")
    return pruning({p.name: read(p) for p in found})


def lr_studies(study: str) -> str:
    """Per lr study in ``study``'s archive (``archive/``, else ``partial-archive/``): its trials
    and those pruned, the range they searched (each trial's, as it was drawn; the study widens
    between trials), its best lr and where it lies in that range, and the lr its strategy's
    runs trained at."""
    from ablate.archive import read
    from ablate.lrstudy import interior, position, pruned, searched, trained_out
    from ablate.lrstudy.runs import lr_aside

    folder = next((study_dir(study) / n for n in (ARCHIVE, PARTIAL)
                   if (study_dir(study) / n).is_dir()), None)  # fmt: skip
    if folder is None:
        raise NoResults(f"_No archive yet beside `docs/results/{study}/`._")
    held = read(folder)
    role = {entry["run_id"]: entry["role"] for entry in held.index["runs"]}
    trials: dict[str, list] = {}
    for run in sorted(held.runs, key=lambda r: r.info.get("start_time") or 0):
        if role[run.run_id] == "trial":
            trials.setdefault(run.params.get("freeze.name", "?"), []).append(run)
    for option, runs in trials.items():  # an earlier study with other settings: not this one's
        latest = lr_aside(runs[-1].params)
        trials[option] = [r for r in runs if lr_aside(r.params) == latest]
    trained: dict[str, set[float]] = {}
    for run in current_runs(held):
        trained.setdefault(run.params.get("freeze.name"), set()).add(
            float(run.params["trainer.lr"])
        )
    rows = []
    for option, runs in sorted(trials.items()):
        cut = [r for r in runs if pruned(r.tags)]
        done = [r for r in runs if trained_out(r.info.get("status"), r.tags)]
        value = {
            r.run_id: max(v for k, *_, v in r.metrics if k.startswith("best_dev_")) for r in done
        }
        # of equal values the earliest, as the study's own pick
        best = max(done, key=lambda r: value[r.run_id], default=None)
        span = searched(r.tags for r in runs)
        lr = float(best.params["trainer.lr"]) if best else None
        rows.append([  # trials: those that ended (a try a kill cut short ran again)
            code(option), str(len(done) + len(cut)), str(len(cut)),
            f"[{span[0]:g}, {span[1]:g}]" if span else "not recorded",
            f"{lr:.3g}" if lr else "-", f"{value[best.run_id]:.4f}" if best else "-",
            f"{position(lr, span):.2f}" if lr and span else "-",
            ("yes" if interior(lr, span) else "**no**") if lr and span else "-",
            ", ".join(f"{x:.3g}" for x in sorted(trained.get(option, ()))) or "not yet",
        ])  # fmt: skip
    columns = ["strategy", "trials", "pruned", "searched", "best lr", "best dev", "where"]
    columns += ["interior", "runs trained at"]
    return markdown_table(rows, columns, right=["trials", "pruned", "best dev", "where"])


def pruning(archives: Mapping[str, Archive]) -> str:
    """What pruning cost and bought, per study: one row per (study, pruner) from archives of the
    same studies run with each pruner (``archives``: pruner name -> its trials' archive). Epochs
    are the machine-independent cost; wall time (the trials' runs, start to end) includes each
    trial's start-up and, for cached strategies, its frozen features, and depends on the load
    (the mean ``load_per_cpu`` beside it)."""
    from ablate.lrstudy import pruned, trained_out

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
