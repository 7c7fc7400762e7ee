"""A study redone from today's code beside its published report: each rerun against its
published row, and what the page says of the redo so far."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ablate.docs.studies import (
    ARCHIVE,
    PARTIAL,
    PUBLISHED,
    RESULTS,
    cell,
    csv_rows,
    current_runs,
    still_said,
    study_dir,
)  # fmt: skip
from ablate.report.render import millions
from ablate.tables import code, inline, markdown_table


def redone(study: str) -> tuple[Path, Path] | None:
    """A study being redone from today's code: the archive of its runs so far and the folder of
    the report it is compared against (its partial archive and the report beside it, or, once
    complete, its archive and the report in ``published/``); None for a study not redone."""
    folder = study_dir(study)
    if (folder / PARTIAL).is_dir():
        return folder / PARTIAL, folder
    if (folder / ARCHIVE).is_dir() and (folder / PUBLISHED).is_dir():
        return folder / ARCHIVE, folder / PUBLISHED
    return None


def _last(run) -> dict[str, float]:
    """An archived run's metrics, each at its last step, as MLflow's run page shows them."""
    last: dict[str, tuple[int, float]] = {}
    for key, step, _, value in run.metrics:
        if key not in last or step >= last[key][0]:
            last[key] = (step, value)
    return {k: v for k, (_, v) in last.items()}


def _last_scores(run) -> dict:
    """A run's dev and test scores as the report reads them."""
    from ablate.report.load import scores

    return scores(run.params, _last(run))


def rerun_changes(study: str = RESULTS) -> str:
    """Every run of ``study``'s archive that a later run of the same strategy, seed and settings
    replaced (a rerun with ``skip_finished=false``) where the two differ in dev or test score:
    both runs' scores and start dates, as a table; a sentence where none differ."""
    from ablate.archive import read
    from ablate.tracking.params import settings

    folder = study_dir(study) / ARCHIVE
    if not folder.is_dir():
        return f"_No archive yet beside `docs/results/{study}/`._"
    held = read(folder)
    kept = {r.run_id: r for r in current_runs(held)}
    role = {entry["run_id"]: entry["role"] for entry in held.index["runs"]}
    by_seed = {(cell(r), r.params.get("seed"), tuple(sorted(settings(r.params).items()))): r
               for r in kept.values()}  # fmt: skip
    rows = []
    for run in sorted(held.runs, key=lambda r: r.info.get("start_time") or 0):
        if role[run.run_id] != "run" or run.run_id in kept or run.info.get("status") != "FINISHED":
            continue
        key = (cell(run), run.params.get("seed"), tuple(sorted(settings(run.params).items())))
        if (later := by_seed.get(key)) is None:
            continue  # replaced by runs with other settings (a new lr): no rerun of it
        was, now = _last_scores(run), _last_scores(later)
        if (was["dev"], was["test"]) == (now["dev"], now["test"]):
            continue
        rows.append([
            code(run.params.get("freeze.name", "?")), run.params.get("seed", "?"),
            f"{100 * was['dev']:.4f}", f"{100 * was['test']:.4f}", _day(run),
            f"{100 * now['dev']:.4f}", f"{100 * now['test']:.4f}", _day(later),
        ])  # fmt: skip
    if not rows:
        return (
            "Every run replaced by a rerun of the same setting gave the same dev and test scores."
        )
    when = "(UTC, commit, CPU)"
    columns = ["strategy", "seed", "first dev (%)", "first test (%)", f"first run {when}"]
    columns += ["rerun dev (%)", "rerun test (%)", f"rerun {when}"]
    return markdown_table(rows, columns, right=columns[2:4] + columns[5:7])


def _day(run) -> str:
    """When, from which commit and on which CPU a run trained (the CPU where it was recorded)."""
    from datetime import datetime, timezone

    start = (run.info.get("start_time") or 0) / 1000
    day = datetime.fromtimestamp(start, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
    commit = run.tags.get("git.commit", "")[:7] or "?"
    return f"{day}, {inline(commit)}, {run.tags.get('cpu', 'CPU not recorded')}"


def reruns(study: str = RESULTS) -> list[dict[str, Any]]:
    """Each run of ``study``'s redo (``redone``) against its published row (``runs.csv``: the
    same strategy and seed): run name, the archived and published dev and test scores, and
    whether both are equal to the last digit. Of a strategy's runs, those with its latest run's
    settings, as the report takes them (a strategy redone at a new lr supersedes its earlier
    runs); empty for a study not redone."""
    from ablate.archive import read

    if (redo := redone(study)) is None:
        return []
    keys = ("data", "model", "freeze", "seed")
    published = {tuple(r[k] for k in keys): r for r in csv_rows(str(redo[1]), "runs.csv")}
    out = []
    held = read(redo[0])
    for run in current_runs(held):
        got = _last_scores(run)
        row = published.get((*cell(run), run.params.get("seed")))
        was = {k: float(row[k]) if row and row[k] else None for k in ("dev", "test", "lr")}
        out.append(
            {
                "run": run.info.get("run_name") or run.run_id,
                "freeze": run.params.get("freeze.name"),
                "seed": run.params.get("seed"),
                "dev": got["dev"],
                "test": got["test"],
                "published_dev": was["dev"],
                "published_test": was["test"],
                "lr": float(run.params["trainer.lr"]),
                "trainable_params": _last(run).get("trainable_params"),
                "published_lr": was["lr"],
                "same": row is not None and (got["dev"], got["test"]) == (was["dev"], was["test"]),
            }
        )
    return out


def _mean_pct(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if r[key] is not None]
    return f"{100 * sum(values) / len(values):.2f}" if values else "?"


def reruns_said(study: str) -> str:
    """What the redo beside a page (``redone``) shows; empty without one: the runs rerun with
    their published recipe (equal to the last digit, or which differ), a table of the strategies
    redone at another lr (their study searched again) or new, and the strategies still to run."""
    if (redo := redone(study)) is None:
        return ""
    name = study_dir(study).name
    complete = redo[0].name == ARCHIVE
    found = reruns(study)
    where = f"[{name}/{redo[0].name}/]({name}/{redo[0].name}/)"
    so_far = "" if complete else " so far"
    same = [r for r in found if r["lr"] == r["published_lr"]]
    said = ""
    if complete:
        said = (
            f" It redoes a study first published from a store since lost; that report, as it "
            f"was, is kept in [{name}/{PUBLISHED}/]({name}/{PUBLISHED}/), and this page's tables "
            f"are the redo's."
        )
    if same:
        runs = ", ".join(sorted(inline(f"{r['freeze']} s{r['seed']}") for r in same))
        total = len(csv_rows(str(redo[1]), "runs.csv"))
        said += f" Rerun from today's code{so_far}: {len(same)} of its {total} published runs "
        said += f"({runs}), archived in {where}; "
        differ = "; ".join(
            f"{inline(r['freeze'])} s{inline(r['seed'])}: dev {r['dev']} (published "
            f"{r['published_dev']}), test {r['test']} (published {r['published_test']})"
            for r in same
            if not r["same"]
        )
        said += (
            f"these differ from their published scores: {differ}."
            if differ
            else "each gives its published dev and test accuracy to the last digit."
        )
    if table := _redone_table(found, {r["freeze"] for r in same}):
        said += (
            f" {'So far from' if so_far else 'From'} today's code, each strategy at the lr its "
            f"study picked again, archived in {where}, against its published row (means over "
            f"their seeds, the best dev accuracy first; `new`: a strategy the published study "
            f"did not have):\n\n{table}\n\n"
        )
    if left := still_said(study, {r["freeze"] for r in found}):
        said = said.rstrip() + ("\n\n" if table else " ") + left
    return said


REDONE_COLUMNS = ["strategy", "lr", "published lr", "seeds", "dev accuracy (%)", "published dev",
                  "dev change (pt)", "test accuracy (%)", "published test",
                  "trainable params (M)"]  # fmt: skip


def _change(rows: list[dict]) -> str:
    """The mean dev accuracy of ``rows`` against their published mean, in points."""
    pairs = [
        (r["dev"], r["published_dev"]) for r in rows if None not in (r["dev"], r["published_dev"])
    ]
    if not pairs:
        return "—"
    return f"{round(100 * sum(a - b for a, b in pairs) / len(pairs), 2) + 0.0:+.2f}"  # no -0.00


def _redone_table(found: list[dict], same: set[str]) -> str:
    """The strategies of ``found`` (``reruns``) not rerun at their published lr, one row each:
    lr, seeds, dev and test against their published values and the change of dev accuracy
    (``new`` where the published study did not have the strategy), trainable parameters; empty
    where there are none."""
    lines = []
    for freeze in sorted({r["freeze"] for r in found} - same):  # ties keep this order
        rows = [r for r in found if r["freeze"] == freeze]
        was = rows[0]["published_lr"]  # None: a strategy the published study did not have
        published = (
            ["new", "—", "—", "—"]
            if was is None
            else [
                f"{was:.3g}",
                _mean_pct(rows, "published_dev"),
                _change(rows),
                _mean_pct(rows, "published_test"),
            ]  # fmt: skip
        )
        lines.append([code(freeze), f"{rows[0]['lr']:.3g}", published[0],
                      ", ".join(sorted(r["seed"] for r in rows)), _mean_pct(rows, "dev"),
                      published[1], published[2], _mean_pct(rows, "test"), published[3],
                      millions(rows[0]["trainable_params"] / 1e6)
                      if rows[0]["trainable_params"] is not None else "?"])  # fmt: skip
    lines.sort(key=lambda line: -float(line[4]) if line[4] != "?" else 0.0)
    return markdown_table(lines, REDONE_COLUMNS, right=REDONE_COLUMNS[1:]) if lines else ""
