"""The generated blocks about published studies (``docs/results/<study>/``): their tables,
provenance, findings and source, computed from each study's report (``summary.csv``,
``runs.csv``) and the archive being redone beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ablate.config import project_root
from ablate.report.render import millions, share
from ablate.report.summary import LR_FROM_STUDY
from ablate.tables import markdown_table

RESULTS = "naija"  # the README's study: docs/results/<name>/, a report made by make report
# a study being redone into its partial archive: the experiment (conf/experiment/) whose sweep
# lists the strategies it is to hold
REDONE_AS = {"naija-fair": "fair"}


class NoResults(Exception):
    """The published study's report is not there (yet)."""


def study_dir(study: str) -> Path:
    """A published report's folder: ``docs/results/<study>``, or ``study`` where it is one."""
    return Path(study) if Path(study).is_absolute() else project_root() / "docs" / "results" / study


def _csv(study: str, name: str = "summary.csv") -> list[dict[str, str]]:
    """The rows of a published report's csv file (``summary.csv``, ``runs.csv``); one panel only
    (one dataset and model)."""
    import csv

    file = study_dir(study) / name
    path = file.relative_to(project_root()) if file.is_relative_to(project_root()) else file
    if not file.is_file():
        raise NoResults(f"_No published study yet: `{path}` is missing (see docs/results/)._")
    with file.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if len({r["panel"] for r in rows}) > 1:
        raise ValueError(f"{path}: more than one panel; make the report with --data <one>")
    return rows


def _pct(row: dict, key: str) -> str:
    std = row[f"{key}_std_pct"]
    return f"{float(row[f'{key}_mean_pct']):.2f}" + (f" ± {float(std):.2f}" if std else "")


def _rerun(row: dict) -> str:
    """The command that reruns a summary row's cell (every seed of it); a strategy trained at
    its own study's lr (experiment=fair) first runs that study."""
    s = row["strategy"]
    if row["lr_from"] == LR_FROM_STUDY:
        return (
            f"`python -m ablate.lrstudy experiment=fair freeze={s}`, then "
            f"`python -m ablate.train --multirun experiment=fair freeze={s}`"
        )
    return f"`python -m ablate.train --multirun experiment=paper data={row['data']} freeze={s}`"


def results_table(study: str = RESULTS, rerun: bool = False) -> str:
    """The published study's summary (``summary.csv`` of its report) as a table; ``rerun``: each
    row with the command that reruns it."""
    numbers = ["lr", "dev accuracy (%)", "test accuracy (%)", "trainable params (M)"]
    numbers += ["train time (s)", "seeds"]
    rows = []
    for row in _csv(study):
        lr = f"{float(row['lr']):.2g}" + (" (tuned)" if row["lr_from"] == LR_FROM_STUDY else "")
        rows.append(
            [f"`{row['strategy']}`", lr, _pct(row, "dev"), _pct(row, "test")]
            + [millions(float(row["trainable_params_m"])), f"{float(row['train_time_s']):.0f}"]
            + [row["n"], *([_rerun(row)] if rerun else [])]
        )
    columns = ["strategy", *numbers, *(["rerun it"] if rerun else [])]
    return markdown_table(rows, columns, right=numbers)


def results_provenance(study: str = RESULTS) -> str:
    """Which runs the published study's report used: how many, when, from which commit
    (its ``runs.csv``)."""
    runs = _csv(study, "runs.csv")
    commits = sorted({r["git_commit"][:7] for r in runs if r["git_commit"]})
    starts = sorted(r["start_time"][:16] for r in runs)
    seeds = sorted({int(r["seed"]) for r in runs})
    return (
        f"{len(runs)} runs ({', '.join(sorted({r['freeze'] for r in runs}))}; seeds "
        f"{', '.join(map(str, seeds))}), started {starts[0]} to {starts[-1]} "
        f"UTC, from commit {', '.join(commits) or 'unknown'}; each run by id in "
        f"[runs.csv]({study_dir(study).name}/runs.csv)."
    )


def results_findings(study: str = RESULTS) -> str:
    """What the published study's numbers say, a sentence per strategy against full
    fine-tuning, computed from its ``summary.csv``."""
    rows = _csv(study)
    base = next((r for r in rows if r["delta_method"] == "baseline"), None)
    if base is None:
        return "No full fine-tuning (`none`) run: nothing to compare against."
    lines = [
        f"- Full fine-tuning (`{base['strategy']}`) reaches {_pct(base, 'dev')} % dev and "
        f"{_pct(base, 'test')} % test accuracy over seeds {base['seeds']}, training for "
        f"{float(base['train_time_s']):.0f} s."
    ]
    for r in rows:
        if r is base or not r["delta_dev_pt"]:
            continue
        delta = float(r["delta_dev_pt"])
        ci = ""
        if r["delta_ci_low_pt"]:
            low, high = float(r["delta_ci_low_pt"]), float(r["delta_ci_high_pt"])
            ci = f" (95 % CI {low:+.2f} to {high:+.2f})"
        lr = " at the lr its own study picked" if r["lr_from"] == LR_FROM_STUDY else ""
        params, saved = share(float(r["param_savings_pct"]), 0), float(r["time_savings_pct"])
        time = f"{share(abs(saved), 0)} % {'less' if saved >= 0 else 'more'} training time"
        lines.append(
            f"- `{r['strategy']}`{lr} trains {params} % fewer parameters in {time}, and "
            f"scores {delta:+.2f} points of dev accuracy{ci}."
        )
    if best := results_best(study):
        lines.append(f"- {best}")
    return "\n".join(lines)


def results_best(study: str = RESULTS) -> str:
    """The strategy within half a point of full fine-tuning's dev accuracy that saves the most
    training time, with its savings, from the study's ``summary.csv``; empty where none is. A
    saving that rests on a time measured beside other work says so, as the report marks it."""
    import pandas as pd

    from ablate.report.cell import savings_loaded

    rows = _csv(study)
    table = pd.read_csv(study_dir(study) / "summary.csv")
    # a report older than the load columns recorded no load: not marked
    load = ["load_per_cpu", "busy_cpus_at_start", "jobs_on_gpu"]
    table = table.reindex(columns=[*table.columns, *(c for c in load if c not in table)])
    marked = savings_loaded(table).tolist()
    close = [
        (r, busy)
        for r, busy in zip(rows, marked, strict=True)
        if r["delta_method"] != "baseline"
        and r["delta_dev_pt"]
        and r["time_savings_pct"]
        and float(r["delta_dev_pt"]) > -0.5
    ]
    if not close:
        return ""
    r, busy = max(close, key=lambda pair: float(pair[0]["time_savings_pct"]))
    lr = " at the lr its own study picked" if r["lr_from"] == LR_FROM_STUDY else ""
    return (
        f"Within half a point of full fine-tuning, `{r['strategy']}`{lr} saves the most training "
        f"time ({float(r['time_savings_pct']):.0f} %"
        f"{', timed beside other work' if busy else ''}), training "
        f"{share(float(r['param_savings_pct']), 0)} % fewer parameters and scoring "
        f"{float(r['delta_dev_pt']):+.2f} points of dev accuracy."
    )


ARCHIVE = "archive"  # a study's archive: docs/results/<study>/archive/ (python -m ablate.archive)
# the runs of a study rerun so far, archived while the rest still runs (docs/results/<study>/)
PARTIAL = "partial-archive"
# a redone study's report as published (its summary.csv, runs.csv), kept once its archive is
# complete and the report beside the page is the archive's
PUBLISHED = "published"


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


def reruns(study: str = RESULTS) -> list[dict[str, Any]]:
    """Each run of ``study``'s redo (``redone``) against its published row (``runs.csv``: the
    same strategy and seed): run name, the archived and published dev and test scores, and
    whether both are equal to the last digit. Of a strategy's runs, those with its latest run's
    settings, as the report takes them (a strategy redone at a new lr supersedes its earlier
    runs); empty for a study not redone."""
    from ablate.archive import read
    from ablate.report.load import scores

    if (redo := redone(study)) is None:
        return []
    keys = ("data", "model", "freeze", "seed")
    published = {tuple(r[k] for k in keys): r for r in _csv(str(redo[1]), "runs.csv")}
    out = []
    held = read(redo[0])
    for run in current_runs(held):
        last: dict[str, tuple[int, float]] = {}
        for key, step, _, value in run.metrics:  # a key's value at its last step, as MLflow's
            if key not in last or step >= last[key][0]:
                last[key] = (step, value)
        got = scores(run.params, {k: v for k, (_, v) in last.items()})
        row = published.get((*_cell(run), run.params.get("seed")))
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
                "trainable_params": last.get("trainable_params", (0, None))[1],
                "published_lr": was["lr"],
                "same": row is not None and (got["dev"], got["test"]) == (was["dev"], was["test"]),
            }
        )
    return out


def current_runs(held) -> list:
    """An archive's runs (not its sweeps, nor its lr-study trials) as the report takes them: the
    FINISHED ones, per dataset, model and strategy those with its latest run's settings (a
    strategy redone at a new lr supersedes its earlier runs), of each seed the latest (a rerun
    with ``skip_finished=false`` supersedes the earlier run); by start time."""
    from ablate.tracking.params import settings

    role = {entry["run_id"]: entry["role"] for entry in held.index["runs"]}
    runs = sorted(
        (r for r in held.runs if role[r.run_id] == "run" and r.info.get("status") == "FINISHED"),
        key=lambda r: r.info.get("start_time") or 0,
    )

    latest = {_cell(r): settings(r.params) for r in runs}
    runs = [r for r in runs if settings(r.params) == latest[_cell(r)]]
    last = {(_cell(r), r.params.get("seed")): r for r in runs}
    return [r for r in runs if last[_cell(r), r.params.get("seed")] is r]


def _cell(run) -> tuple:
    """A run's dataset, model and strategy, as the report names them."""
    from ablate.report.load import param_name

    return tuple(param_name(run.params, k) for k in ("data", "model", "freeze"))


def _mean_pct(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if r[key] is not None]
    return f"{100 * sum(values) / len(values):.2f}" if values else "?"


def _reruns_said(study: str) -> str:
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
        runs = ", ".join(sorted(f"{r['freeze']} s{r['seed']}" for r in same))
        total = len(_csv(str(redo[1]), "runs.csv"))
        said += f" Rerun from today's code{so_far}: {len(same)} of its {total} published runs "
        said += f"({runs}), archived in {where}; "
        differ = "; ".join(
            f"{r['freeze']} s{r['seed']}: dev {r['dev']} (published {r['published_dev']}), "
            f"test {r['test']} (published {r['published_test']})"
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
    if left := _still_to_run(study, {r["freeze"] for r in found}):
        sep = "\n\n" if table else " "
        said = said.rstrip() + f"{sep}Still to run: {', '.join(f'`{s}`' for s in left)}."
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
        lines.append([f"`{freeze}`", f"{rows[0]['lr']:.3g}", published[0],
                      ", ".join(sorted(r["seed"] for r in rows)), _mean_pct(rows, "dev"),
                      published[1], published[2], _mean_pct(rows, "test"), published[3],
                      millions(rows[0]["trainable_params"] / 1e6)
                      if rows[0]["trainable_params"] is not None else "?"])  # fmt: skip
    lines.sort(key=lambda line: -float(line[4]) if line[4] != "?" else 0.0)
    return markdown_table(lines, REDONE_COLUMNS, right=REDONE_COLUMNS[1:]) if lines else ""


def _still_to_run(study: str, done: set[str]) -> list[str]:
    """The strategies of the experiment ``study`` is redone as (its sweep's ``freeze`` list)
    that its archive does not hold yet, in the sweep's order."""
    from omegaconf import OmegaConf

    if (experiment := REDONE_AS.get(study_dir(study).name)) is None:
        return []
    conf = OmegaConf.load(project_root() / "conf" / "experiment" / f"{experiment}.yaml")
    wanted = str(conf.hydra.sweeper.params.freeze).split(",")
    return [s for s in wanted if s not in done]


def results_source(study: str = RESULTS) -> str:
    """Where a published study's tables come from: the archive beside its page, or runs no
    longer held (its report as written when the runs were in a store)."""
    from ablate.archive import INDEX, MANIFEST

    folder = study_dir(study)
    name = folder.name
    index = folder / ARCHIVE / INDEX
    if not index.is_file():
        return (
            f"**From runs no longer held.** The store these runs were tracked in went with its "
            f"machine and no archive of them exists, so this section's tables and charts are its "
            f"report as written then ([{name}/summary.csv]({name}/summary.csv), "
            f"[{name}/runs.csv]({name}/runs.csv)): `python -m ablate.docs` re-reads them, but "
            f"cannot rebuild them with today's report or check them against the runs until the "
            f"study runs again and its archive is kept beside this page "
            f"(`python -m ablate.archive export ... docs/results/{name}/{ARCHIVE}`)."
            + _reruns_said(study)
        )
    held = json.loads(index.read_text(encoding="utf-8"))
    roles: dict[str, int] = {}
    for run in held["runs"]:
        roles[run["role"]] = roles.get(run["role"], 0) + 1
    counts = ", ".join(
        f"{roles[r]} {word}{'s' if roles[r] != 1 else ''}"
        for r, word in (("run", "run"), ("sweep", "sweep"), ("trial", "lr-study trial"))
        if roles.get(r)
    )
    return (
        f"Generated from the archive beside this page, [{name}/{ARCHIVE}/]({name}/{ARCHIVE}/) "
        f"({counts}; every file's sha256 in its {MANIFEST}): `python -m ablate.docs` imports it "
        f"into a temporary store and reruns `{' '.join(held['report'])}` into `{name}/`. "
        f"`python -m ablate.archive import docs/results/{name}/{ARCHIVE}` loads it into a store "
        "of your own." + _reruns_said(study)
    ).rstrip()
