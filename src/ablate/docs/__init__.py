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
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from omegaconf import MISSING

from ablate import config, switches
from ablate.config import conf_dir, project_root
from ablate.docs import lrstudies, redo, results
from ablate.docs.studies import ARCHIVE, NoResults
from ablate.errors import AblateError
from ablate.tables import markdown_table

FILES = (
    "README.md",
    "docs/config.md",
    "docs/speed.md",
    "docs/tasks-and-strategies.md",
    "docs/operations.md",
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
    value = config.key_default(f)
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


BLOCKS: dict[str, Callable[[], str]] = {
    "freeze-table": freeze_table,
    "make-help": make_help,
    "config-groups": config_groups,
    "config-keys": config_keys,
    "speed-switches": speed_switches,
    "results-table": results.results_table,
    "results-reruns": functools.partial(results.results_table, rerun=True),
    "results-deltas": results.results_deltas,
    "results-findings": results.results_findings,
    "results-best": results.results_best,
    "results-provenance": results.results_provenance,
    "results-changed": redo.rerun_changes,
    "results-source": results.results_source,
    "lr-pruning": lrstudies.lr_pruning,
    "lr-studies": lrstudies.lr_studies,
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
        text = text.replace(f"`{uri}`", f"the archive `{ARCHIVE}/`").replace(uri, f"{ARCHIVE}/")
        path.write_text(text, encoding="utf-8")


def main() -> None:
    """Rebuild every study under docs/results/ that has an archive beside it, then rewrite the
    generated blocks of every file in ``FILES``."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    published = project_root() / "docs" / "results"
    for folder in sorted(p for p in published.iterdir() if (p / ARCHIVE).is_dir()):
        try:
            regenerate(folder)
        except AblateError as exc:
            sys.exit(f"error: {' '.join(str(exc).split())}")
    for name in FILES:
        path = project_root() / name
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
