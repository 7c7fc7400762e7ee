"""The generated blocks about a published study's lr studies (``docs/results/<study>/``): its
trials per pruner and per strategy, read from the archives beside its page."""

from __future__ import annotations

import json

from ablate.docs.studies import ARCHIVE, PARTIAL, NoResults, current_runs, study_dir
from ablate.tables import code, markdown_table

PRUNING = "pruning"  # docs/results/<study>/pruning/<pruner>/: its lr studies' trials, archived


def lr_pruning(study: str) -> str:
    """Per lr study of ``study``, what pruning cost and bought: its trials run with each pruner,
    read from the archives in ``docs/results/<study>/pruning/<pruner>/``."""
    from ablate.archive import read
    from ablate.report.lrstudy import pruning

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
    from ablate.lrstudy import RANGE_TAG, pruned, trained_out
    from ablate.lrstudy.runs import lr_aside
    from ablate.lrstudy.study import interior, position

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
        spans = [json.loads(r.tags[RANGE_TAG]) for r in runs if RANGE_TAG in r.tags]
        span = [min(s[0] for s in spans), max(s[1] for s in spans)] if spans else None
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
