"""The generated blocks about published studies (``docs/results/<study>/``): their tables,
provenance, findings and source, computed from each study's report (``summary.csv``,
``runs.csv``) and the archive beside it."""

from __future__ import annotations

import json
import math

from ablate.docs.redo import redone, reruns_said
from ablate.docs.studies import (
    ARCHIVE,
    EXPERIMENT,
    RESULTS,
    csv_rows,
    held_strategies,
    still_said,
    study_dir,
)  # fmt: skip
from ablate.report.delta import COLUMNS, disagreement
from ablate.report.render import millions, p_value, share
from ablate.report.summary import LR_FROM_STUDY
from ablate.tables import code, inline, markdown_table


def _pct(row: dict, key: str) -> str:
    std = row[f"{key}_std_pct"]
    return f"{float(row[f'{key}_mean_pct']):.2f}" + (f" ± {float(std):.2f}" if std else "")


def _rerun(row: dict, experiment: str) -> str:
    """The one command that reruns a summary row's first seed at the row's lr, without its lr
    study (``lr_study.freeze=[]``), into an experiment of its own (``rerun``, so the published
    runs a store may hold neither skip it nor gain a duplicate); ``paper``'s grid names its
    dataset."""
    given = f"experiment={experiment}" + (f" data={row['data']}" if experiment == "paper" else "")
    seed = str(row["seeds"]).split(",")[0].strip()
    return code(
        f"python -m ablate.train {given} freeze={row['strategy']} seed={seed} "
        f"trainer.lr={row['lr']} 'lr_study.freeze=[]' tracking.experiment=rerun"
    )


def results_table(study: str = RESULTS, rerun: bool = False) -> str:
    """The published study's summary (``summary.csv`` of its report) as a table; ``rerun``: each
    row with the command that reruns its first seed (``_rerun``)."""
    numbers = ["lr", "dev accuracy (%)", "test accuracy (%)", "trainable params (M)"]
    numbers += ["train time (s)", "seeds"]
    rows = []
    experiment = EXPERIMENT.get(study_dir(study).name, "paper")
    for row in csv_rows(study):
        tuned = row["lr_from"] == LR_FROM_STUDY
        edge = row.get("lr_interior") == "False"  # its study's pick at its range's edge
        lr = (
            f"{float(row['lr']):.2g}"
            + (" (tuned)" if tuned else "")
            + (" **edge**" if edge else "")
        )
        rows.append(
            [code(row["strategy"]), lr, _pct(row, "dev"), _pct(row, "test")]
            + [millions(float(row["trainable_params_m"])), f"{float(row['train_time_s']):.0f}"]
            + [row["n"], *([_rerun(row, experiment)] if rerun else [])]
        )
    columns = ["strategy", *numbers, *(["rerun its first seed"] if rerun else [])]
    return markdown_table(rows, columns, right=numbers)


def results_provenance(study: str = RESULTS) -> str:
    """Which runs the published study's report used: how many, when, from which commit
    (its ``runs.csv``)."""
    runs = csv_rows(study, "runs.csv")
    commits = sorted({inline(r["git_commit"][:7]) for r in runs if r["git_commit"]})
    starts = sorted(inline(r["start_time"][:16]) for r in runs)
    seeds = sorted({int(r["seed"]) for r in runs})
    freezes = sorted({inline(r["freeze"]) for r in runs})
    return (
        f"{len(runs)} runs ({', '.join(freezes)}; seeds "
        f"{', '.join(map(str, seeds))}), started {starts[0]} to {starts[-1]} "
        f"UTC, from commit {', '.join(commits) or 'unknown'}; each run by id in "
        f"[runs.csv]({study_dir(study).name}/runs.csv)."
    )


def _summary(study: str) -> list[dict]:
    """The rows of ``study``'s ``summary.csv`` (``csv_rows``), each with ``loaded``: whether its
    time saving rests on a time measured beside other work (its own or its baseline's), as the
    report marks it, and ``spread``: how far apart the times behind it may lie
    (``savings_spread``), where beyond ``SPREAD`` (NaN otherwise)."""
    import pandas as pd

    from ablate.report.timing import SPREAD, savings_loaded, savings_spread

    rows = csv_rows(study)
    table = pd.DataFrame(rows)
    # a report older than the load and spread columns recorded neither: not marked
    for column in ("load_per_cpu", "busy_cpus_at_start", "jobs_on_gpu", "train_time_spread"):
        table[column] = pd.to_numeric(table.get(column, pd.Series([""] * len(table))))
    spread = savings_spread(table).where(lambda x: x > SPREAD)
    return [
        {**r, "loaded": busy, "spread": wide}
        for r, busy, wide in zip(rows, savings_loaded(table), spread, strict=True)
    ]


def _at_lr(row: dict) -> str:
    return " at the lr its own study picked" if row["lr_from"] == LR_FROM_STUDY else ""


def _timed(row: dict) -> str:
    said = ", timed beside other work" if row["loaded"] else ""
    if row["spread"] == float("inf"):  # one side recorded its CPU's speed, the other not
        said += " (uncertain: it or the baseline timed on a CPU of unrecorded speed)"
    elif row["spread"] > 0:  # NaN where the times agree
        said += f" (uncertain: the times behind it up to {row['spread']:.1f}x apart)"
    return said


def results_findings(study: str = RESULTS) -> str:
    """What the published study's numbers say, a sentence per strategy against full
    fine-tuning, computed from its ``summary.csv``."""
    rows = _summary(study)
    base = next((r for r in rows if r["delta_method"] == "baseline"), None)
    if base is None:
        return "No full fine-tuning (`none`) run: nothing to compare against."
    lines = [
        f"- Full fine-tuning ({code(base['strategy'])}) reaches {_pct(base, 'dev')} % dev and "
        f"{_pct(base, 'test')} % test accuracy over seeds {inline(base['seeds'])}, training for "
        f"{float(base['train_time_s']):.0f} s."
    ]
    compared = [r for r in rows if r is not base and r["delta_dev_pt"]]
    # McNemar's on each strategy's line where any has one, else said once for the study
    some = any(not math.isnan(_number(r, "mcnemar_p")) for r in compared)
    for r in compared:
        params, saved = share(float(r["param_savings_pct"]), 0), float(r["time_savings_pct"])
        time = f"{share(abs(saved), 0)} % {'less' if saved >= 0 else 'more'} training time"
        lines.append(
            f"- {code(r['strategy'])}{_at_lr(r)} trains {params} % fewer parameters in {time}"
            f"{_timed(r)}, and scores {_scored(r, 'dev')}{_on_test(r)}"
            + (f" {_mcnemar_said(r)}" if some else "")
        )
    if not some and (tested := sorted({r.get("mcnemar_tested") or "" for r in compared} - {""})):
        lines.append(
            "- No McNemar test on test items: no seed has both its run's and full fine-tuning's "
            f"test predictions held ({' or '.join(tested)} per strategy)."
        )
    if best := results_best(study):
        lines.append(f"- {best}")
    return "\n".join(lines)


def _number(row: dict, key: str) -> float:
    """A summary.csv value as a float: NaN where empty, or where the report predates the
    column."""
    value = row.get(key) or ""
    return float(value) if value else math.nan


def _scored(r: dict, split: str) -> str:
    """A strategy's difference from full fine-tuning on ``split``, with its interval and its
    Holm-adjusted p where the report has them."""
    pt, low, high = (_number(r, c) for c in COLUMNS[split][:3])
    said = []
    if not math.isnan(low):
        said.append(f"95 % CI {low:+.2f} to {high:+.2f}")
    if not math.isnan(holm := _number(r, f"{COLUMNS[split][4]}_holm")):
        said.append(f"Holm-adjusted p {p_value(holm)}")
    return f"{pt:+.2f} points of {split} accuracy" + (f" ({', '.join(said)})" if said else "")


def _on_test(r: dict) -> str:
    """The difference on test beside dev's, and where the two disagree; nothing for a report
    without test's columns."""
    if math.isnan(_number(r, "delta_test_pt")):
        return "."
    dev, test = ((_number(r, c) for c in COLUMNS[split][:3]) for split in ("dev", "test"))
    said = f" and {_scored(r, 'test')}"
    if apart := disagreement(tuple(dev), tuple(test), bounds=False):
        return f"{said}: dev and test disagree, {apart}."
    return f"{said}."


def _mcnemar_said(r: dict) -> str:
    """McNemar's Holm-adjusted p on test items and on how many seeds it rests."""
    if math.isnan(p := _number(r, "mcnemar_p_holm")):
        return f"No McNemar test on test items ({r.get('mcnemar_tested') or 'no seed'} held)."
    return f"McNemar on test items: Holm-adjusted p {p_value(p)} ({r['mcnemar_tested']})."


def results_deltas(study: str = RESULTS) -> str:
    """Each strategy against full fine-tuning on dev and on test, from the study's
    ``summary.csv``: the paired differences with their 95 % intervals, their Holm-adjusted
    p-values and McNemar's on test items."""
    rows = []
    for r in csv_rows(study):
        if r["delta_method"] in ("baseline", "no baseline run"):
            continue
        cells = [code(r["strategy"])]
        for split in ("dev", "test"):
            pt, low, high = (_number(r, c) for c in COLUMNS[split][:3])
            cells.append(f"{pt:+.2f}" + (f" [{low:+.2f}, {high:+.2f}]" if low == low else ""))
            cells.append(p_value(_number(r, f"{COLUMNS[split][4]}_holm")))
        tested = r.get("mcnemar_tested") or ""
        cells.append(p_value(_number(r, "mcnemar_p_holm")) + (f" ({tested})" if tested else ""))
        cells.append(inline(r.get("delta_test_method") or "–"))
        rows.append(cells)
    columns = ["strategy", "Δ dev (pt) [95 % CI]", "Holm p, dev", "Δ test (pt) [95 % CI]"]
    columns += ["Holm p, test", "McNemar on test, Holm p (seeds)", "interval on test"]
    return markdown_table(rows, columns, right=columns[1:-1])


def results_best(study: str = RESULTS) -> str:
    """The strategy within half a point of full fine-tuning's dev accuracy that saves the most
    training time, with its savings, from the study's ``summary.csv``; empty where none is. A
    saving that rests on a time measured beside other work says so, as the report marks it."""
    close = [
        r
        for r in _summary(study)
        if r["delta_method"] != "baseline"
        and r["delta_dev_pt"]
        and r["time_savings_pct"]
        and float(r["delta_dev_pt"]) > -0.5
    ]
    if not close:
        return ""
    r = max(close, key=lambda row: float(row["time_savings_pct"]))
    said = (
        f"Within half a point of full fine-tuning, {code(r['strategy'])}{_at_lr(r)} saves the most "
        f"training time ({float(r['time_savings_pct']):.0f} %{_timed(r)}), training "
        f"{share(float(r['param_savings_pct']), 0)} % fewer parameters and scoring "
        f"{float(r['delta_dev_pt']):+.2f} points of dev accuracy{_reaches(r)}."
    )
    if _reaches(r) and (inside := [row for row in close if not _reaches(row)]):
        s = max(inside, key=lambda row: float(row["time_savings_pct"]))
        said += (
            f" Of those whose whole interval lies within half a point, {code(s['strategy'])}"
            f"{_at_lr(s)} saves the most ({float(s['time_savings_pct']):.0f} %{_timed(s)}), "
            f"scoring {float(s['delta_dev_pt']):+.2f} points."
        )
    return said


def _reaches(r: dict) -> str:
    """Where the 95 % interval of a strategy within half a point reaches past it: said, so the
    point estimate does not read as the bound."""
    low = float(r["delta_ci_low_pt"]) if r["delta_ci_low_pt"] else None
    if low is None or low > -0.5:
        return ""
    high = float(r["delta_ci_high_pt"])
    return f" (its 95 % interval, {low:+.2f} to {high:+.2f}, reaches past half a point)"


def results_source(study: str = RESULTS) -> str:
    """Where a published study's tables come from: the archive beside its page, or runs no
    longer held (its report as written when the runs were in a store)."""
    from ablate.archive import INDEX, MANIFEST

    folder = study_dir(study)
    name = folder.name
    index = folder / ARCHIVE / INDEX
    if not index.is_file() and not (folder / "summary.csv").is_file() and not redone(study):
        return f"**Not run yet.** {still_said(study, set())}".rstrip()
    if not index.is_file():
        return (
            f"**From runs no longer held.** The store these runs were tracked in went with its "
            f"machine and no archive of them exists, so this section's tables and charts are its "
            f"report as written then ([{name}/summary.csv]({name}/summary.csv), "
            f"[{name}/runs.csv]({name}/runs.csv)): `python -m ablate.docs` re-reads them, but "
            f"cannot rebuild them with today's report or check them against the runs until the "
            f"study runs again and its archive is kept beside this page "
            f"(`python -m ablate.archive export ... docs/results/{name}/{ARCHIVE}`)."
            + reruns_said(study)
        )
    held = json.loads(index.read_text(encoding="utf-8"))
    report = code(" ".join(map(str, held["report"])))  # the archive's own words: shown as code
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
        f"into a temporary store and reruns {report} into `{name}/`. "
        f"`python -m ablate.archive import docs/results/{name}/{ARCHIVE}` loads it into a store "
        "of your own." + (reruns_said(study) if redone(study) else f" {_left(study)}")
    ).rstrip()


def _left(study: str) -> str:
    """What a study run as an experiment of its own still lacks, by its archive's runs."""
    return still_said(study, held_strategies(study_dir(study)))
