"""Generated blocks of the README and docs/, so numbers and lists users read there are computed,
never typed in.

``python -m ablate.docs`` rewrites every ``<!-- NAME:start -->…<!-- NAME:end -->`` block of the
files in ``FILES``; ``tests/test_docs.py`` fails when a block is stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

from omegaconf import MISSING

from ablate import config
from ablate.config import conf_dir, project_root
from ablate.speed import registry

FILES = ("README.md", "docs/config.md", "docs/speed.md")


def _first_comment(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


# Variants worth a row of their own: (option, extra overrides, what they change).
VARIANTS = [
    ("all", ["model.head=bilstm"], "As `all`, with a BiLSTM head between encoder and classifier."),
]


def freeze_table(model: str = "minilm") -> str:
    """Markdown table: each ``freeze`` option, what it does, its trainable params on ``model``."""
    from hydra import compose, initialize_config_dir

    from ablate import strategies, tasks
    from ablate.models.build import build

    rows = []
    pos = tasks.get("pos")
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cases = [
            (p.stem, [], _first_comment(p)) for p in sorted((conf_dir() / "freeze").glob("*.yaml"))
        ]
        for option, extra, what in cases + VARIANTS:
            cfg = compose("train", overrides=[f"model={model}", f"freeze={option}", *extra])
            # A fresh model per option: strategies may wrap or change it.
            applied = strategies.apply(build(cfg.model, pos.model_class, pos.labels), cfg.freeze)
            name = " ".join([f"freeze={option}", *extra])
            a = applied
            rows.append(
                f"| `{name}` | {what} | {a.trainable_params:,} | {a.total_params:,} | "
                f"{a.trainable_pct:.2f} % |"
            )
    header = (
        f"| option | what it does | trainable params ({model}) | total params | trainable |\n"
        "|---|---|---:|---:|---:|"
    )
    return "\n".join([header, *rows])


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
    rows = ["| key | default | meaning | identity | setting |", "|---|---|---|:-:|:-:|"]
    for dotted, f in config.schema_keys():
        switch = registry.BY_KEY.get(dotted)
        doc = f.metadata.get("doc", "")
        if switch is not None:
            doc = f"speed switch ([speed.md](speed.md)): {doc}"
        identity = "yes" if f.metadata.get("identity", True) else "no"
        if f.metadata.get("added"):
            identity = "if set"
        setting = "yes" if f.metadata.get("setting", True) else "no"
        rows.append(f"| `{dotted}` | {_default(f)} | {doc} | {identity} | {setting} |")
    return "\n".join(rows)


def speed_switches() -> str:
    """Every speed switch: its default, what it amounts to per device, and its results."""
    rows = [
        "| switch | default | cpu | cuda | results | what it does |",
        "|---|---|---|---|---|---|",
    ]

    for s in registry.SWITCHES:
        rows.append(
            f"| `{s.key}` | `{_shown(s.default)}` | {_shown(s.devices['cpu'])} | "
            f"{_shown(s.devices['cuda'])} | {s.results} | {s.doc} |"
        )
    return "\n".join(rows)


RESULTS = "docs/results/naija/summary.csv"  # the study's report (make report), see docs/results/


def results_table(path: str = RESULTS) -> str:
    """The README's showcase table, read from the published study's ``summary.csv``."""
    import csv

    with (project_root() / path).open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))

    def pct(row: dict, key: str) -> str:
        std = row[f"{key}_std_pct"]
        return f"{float(row[f'{key}_mean_pct']):.2f}" + (f" ± {float(std):.2f}" if std else "")

    lines = [
        "| strategy | dev accuracy (%) | test accuracy (%) | trainable params (M) | "
        "train time (s) | seeds |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        lines.append(
            f"| `{row['strategy']}` | {pct(row, 'dev')} | {pct(row, 'test')} | "
            f"{float(row['trainable_params_m']):.2f} | {float(row['train_time_s']):.0f} | "
            f"{row['n']} |"
        )
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[], str]] = {
    "freeze-table": freeze_table,
    "make-help": make_help,
    "config-groups": config_groups,
    "config-keys": config_keys,
    "speed-switches": speed_switches,
    "results-table": results_table,
}


def render(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> str:
    """``text`` with every known generated block replaced by its current content."""
    for name, fn in blocks.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
        if pattern.search(text):
            content = fn()
            text = pattern.sub(lambda m, c=content: f"{m[1]}{c}\n{m[2]}", text)
    return text


def main() -> None:
    """Rewrite the generated blocks of every file in ``FILES``."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    for name in FILES:
        path = project_root() / name
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
