"""Generated blocks of the README and docs/, so numbers and lists users read there are computed,
never typed in.

``python -m ablate.docs`` rebuilds each study's report under ``docs/results/`` from the archive
beside it where there is one (``regenerate``), then rewrites every
``<!-- NAME:start -->…<!-- NAME:end -->`` block of the files in ``FILES``; ``tests/test_docs.py``
fails when a block is stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from omegaconf import MISSING

from ablate import config, switches
from ablate.config import conf_dir, project_root
from ablate.errors import AblateError
from ablate.report.render import millions, share
from ablate.report.summary import LR_FROM_STUDY
from ablate.tables import markdown_table

FILES = (
    "README.md",
    "docs/config.md",
    "docs/speed.md",
    "docs/tasks-and-strategies.md",
    "docs/results/README.md",
)


def _first_comment(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


# The strategy families of the earlier studies, whose options the README's table lists; every
# option, the peft methods' too, is in docs/tasks-and-strategies.md (``freeze-table all``).
STUDIED_FAMILIES = ("layers", "bitfit", "llrd", "gradual", "lora")


@functools.cache
def _freeze_row(option: str, model: str) -> tuple[str, tuple[str, ...]]:
    """(the option's strategy family, its row of the freeze table)."""
    from ablate import strategies, tasks
    from ablate.models.build import build

    pos = tasks.get("pos")
    cfg = config.compose(f"model={model}", f"freeze={option}")
    # A fresh model per option: strategies may wrap or change it.
    a = strategies.apply(build(cfg.model, pos.model_class, pos.labels), cfg.freeze)
    what = _first_comment(conf_dir() / "freeze" / f"{option}.yaml")
    return cfg.freeze.strategy, (
        f"`freeze={option}`",
        what,
        f"{a.trainable_params:,}",
        f"{a.total_params:,}",
        f"{a.trainable_pct:.2f} %",
    )


def freeze_table(options: str = "studied", model: str = "minilm") -> str:
    """Markdown table: each ``freeze`` option, what it does, its trainable params on ``model``.
    ``options``: ``studied``, those of the earlier studies' families (``STUDIED_FAMILIES``);
    ``all``."""
    if options not in ("studied", "all"):
        raise ValueError(f"freeze-table {options!r}: one of studied, all")
    paths = sorted((conf_dir() / "freeze").glob("*.yaml"))
    found = [_freeze_row(path.stem, model) for path in paths]
    rows = [row for family, row in found if options == "all" or family in STUDIED_FAMILIES]
    columns = ["option", "what it does", f"trainable params ({model})", "total params", "trainable"]
    return markdown_table(rows, columns, right=columns[2:])


def make_help() -> str:
    """The Makefile's targets and their ``##`` help, as a markdown list."""
    lines = (project_root() / "Makefile").read_text(encoding="utf-8").splitlines()
    items = [re.match(r"^([a-z-]+):.*## (.*)$", line) for line in lines]
    return "\n".join(f"- `make {m[1]}` — {m[2]}" for m in items if m)


def config_groups() -> str:
    """Every config group (a folder of ``conf/``) and its options, with each option's first
    comment line."""
    lines = []
    # conf/local/ is this machine's (git-ignored); hydra/ holds launcher presets, listed by hand
    skip = ("hydra", "local")
    for folder in sorted(p for p in conf_dir().iterdir() if p.is_dir() and p.name not in skip):
        lines += [f"- `{folder.name}=`"]
        for option in sorted(folder.glob("*.yaml")):
            lines.append(f"  - `{option.stem}`: {_first_comment(option)}")
    return "\n".join(lines)


def _shown(value) -> str:
    """A config value as YAML writes it."""
    if isinstance(value, bool) or value is None:
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        value = MISSING
    return "(per option)" if value == MISSING else f"`{_shown(value)}`"


def config_keys() -> str:
    """Every key of the schema: its default, what it means, whether it is part of a run's
    identity and whether runs that differ in it are different settings (``ablate.config.key``)."""
    rows = []
    for dotted, f in config.schema_keys():
        switch = switches.BY_KEY.get(dotted)
        doc = f.metadata.get("doc", "")
        if switch is not None:
            doc = f"speed switch ([speed.md](speed.md)): {doc}"
        identity = "yes" if f.metadata.get("identity", True) else "no"
        if f.metadata.get("added"):
            identity = "if set"
        setting = "yes" if f.metadata.get("setting", True) else "no"
        rows.append((f"`{dotted}`", _default(f), doc, identity, setting))
    columns = ["key", "default", "meaning", "identity", "setting"]
    return markdown_table(rows, columns, center=["identity", "setting"], markup=True)


def speed_switches() -> str:
    """Every speed switch: its default, what it amounts to per device, and its results."""
    rows = [
        (
            f"`{s.key}`",
            f"`{_shown(s.default)}`",
            _shown(s.devices["cpu"]),
            _shown(s.devices["cuda"]),
            s.results,
            s.doc,
        )
        for s in switches.SWITCHES
    ]
    columns = ["switch", "default", "cpu", "cuda", "results", "what it does"]
    return markdown_table(rows, columns, markup=True)


RESULTS = "naija"  # the README's study: docs/results/<name>/, a report made by make report


class NoResults(Exception):
    """The published study's report is not there (yet)."""


def _dir(study: str) -> Path:
    """A published report's folder: ``docs/results/<study>``, or ``study`` where it is one."""
    return Path(study) if Path(study).is_absolute() else project_root() / "docs" / "results" / study


def _csv(study: str, name: str = "summary.csv") -> list[dict[str, str]]:
    """The rows of a published report's csv file (``summary.csv``, ``runs.csv``); one panel only
    (one dataset and model)."""
    import csv

    file = _dir(study) / name
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
        f"[runs.csv]({_dir(study).name}/runs.csv)."
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
    close = []
    for r in rows:
        if r is base or not r["delta_dev_pt"]:
            continue
        delta = float(r["delta_dev_pt"])
        ci = ""
        if r["delta_ci_low_pt"]:
            low, high = float(r["delta_ci_low_pt"]), float(r["delta_ci_high_pt"])
            ci = f" (95 % CI {low:+.2f} to {high:+.2f})"
        lr = " at the lr its own study picked" if r["lr_from"] == LR_FROM_STUDY else ""
        params, time = (share(float(r[f"{k}_savings_pct"]), 0) for k in ("param", "time"))
        lines.append(
            f"- `{r['strategy']}`{lr} trains {params} % fewer "
            f"parameters in {time} % less training time, and scores "
            f"{delta:+.2f} points of dev accuracy{ci}."
        )
        if delta > -0.5:
            close.append((float(r["time_savings_pct"]), r["strategy"]))
    if close:
        saving, name = max(close)
        lines.append(
            f"- Within half a point of full fine-tuning, `{name}` saves the most training time "
            f"({saving:.0f} %)."
        )
    return "\n".join(lines)


ARCHIVE = "archive"  # a study's archive: docs/results/<study>/archive/ (python -m ablate.archive)


def results_source(study: str = RESULTS) -> str:
    """Where a published study's tables come from: the archive beside its page, or runs no
    longer held (its report as written when the runs were in a store)."""
    from ablate.archive import INDEX, MANIFEST

    folder = _dir(study)
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
        "of your own."
    )


def regenerate(folder: Path) -> None:
    """Rebuild the report in ``folder`` (summary.md, summary.csv, runs.csv, charts) from the
    archive beside it (``folder/archive``): imported into a temporary store and reported with the
    command the archive names. runs.csv and summary.md then name the archive's run ids and the
    archive, not the temporary store's."""
    from ablate.archive import read, report_args
    from ablate.archive.import_ import import_archive
    from ablate.report.cli import main as report

    held = read(folder / ARCHIVE)
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        _, ids = import_archive(held, uri)
        args = [*report_args(held.index["scope"]), "--uri", uri, "--out", str(folder)]
        if report(args) != 0:
            raise AblateError(f"{folder / ARCHIVE}: the report of its runs failed (above)")
    # the temporary store's ids and address mean nothing once it is gone: the archive's instead
    back = {new: old for old, new in ids.items()}
    for name in ("runs.csv", "summary.md"):
        path = folder / name
        text = re.sub(r"\b[0-9a-f]{32}\b", lambda m: back.get(m[0], m[0]), path.read_text("utf-8"))
        path.write_text(text.replace(uri, f"the archive {ARCHIVE}/"), encoding="utf-8")


BLOCKS: dict[str, Callable[[], str]] = {
    "freeze-table": freeze_table,
    "make-help": make_help,
    "config-groups": config_groups,
    "config-keys": config_keys,
    "speed-switches": speed_switches,
    "results-table": results_table,
    "results-reruns": functools.partial(results_table, rerun=True),
    "results-findings": results_findings,
    "results-provenance": results_provenance,
    "results-source": results_source,
}


def render(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> str:
    """``text`` with every known generated block replaced by its current content. A block may
    name an argument, ``<!-- results-table naija-fair:start -->``: the study it reads."""

    def content(fn: Callable[..., str], arg: str | None) -> str:
        try:
            return fn(arg) if arg else fn()
        except NoResults as missing:
            return str(missing)

    for name, fn in blocks.items():
        pattern = re.compile(
            rf"(<!-- {name}(?: (?P<arg>[\w.-]+))?:start -->\n)(?:.*?\n)?"
            rf"(<!-- {name}(?: (?P=arg))?:end -->)",
            re.S,
        )
        text = pattern.sub(lambda m, f=fn: f"{m[1]}{content(f, m['arg'])}\n{m[3]}", text)
    return text


def main() -> None:
    """Rebuild every study under docs/results/ that has an archive beside it, then rewrite the
    generated blocks of every file in ``FILES``."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    results = project_root() / "docs" / "results"
    for folder in sorted(p for p in results.iterdir() if (p / ARCHIVE).is_dir()):
        try:
            regenerate(folder)
        except AblateError as exc:
            sys.exit(f"error: {' '.join(str(exc).split())}")
    for name in FILES:
        path = project_root() / name
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
