"""Generated README blocks, so numbers users read there are computed, never typed in.

``python -m ablate.docs`` rewrites every ``<!-- NAME:start -->…<!-- NAME:end -->`` block of
README.md; ``tests/test_docs.py`` fails when a block is stale.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

from ablate.config import conf_dir, project_root


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
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cases = [
            (p.stem, [], _first_comment(p)) for p in sorted((conf_dir() / "freeze").glob("*.yaml"))
        ]
        for option, extra, what in cases + VARIANTS:
            cfg = compose("train", overrides=[f"model={model}", f"freeze={option}", *extra])
            # A fresh model per option: strategies may wrap or change it.
            pos = tasks.get("pos")
            applied = strategies.apply(build(cfg.model, pos.model_class, pos.labels), cfg.freeze)
            name = " ".join([f"freeze={option}", *extra])
            count, total, pct = (
                applied.trainable_params,
                applied.total_params,
                applied.trainable_pct,
            )
            rows.append(f"| `{name}` | {what} | {count:,} | {total:,} | {pct:.2f} % |")
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


BLOCKS: dict[str, Callable[[], str]] = {"freeze-table": freeze_table, "make-help": make_help}


def render(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> str:
    """``text`` with every known generated block replaced by its current content."""
    for name, fn in blocks.items():
        pattern = re.compile(rf"(<!-- {name}:start -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.S)
        if pattern.search(text):
            content = fn()
            text = pattern.sub(lambda m, c=content: f"{m[1]}{c}\n{m[2]}", text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=project_root() / "README.md")
    args = parser.parse_args()
    args.readme.write_text(render(args.readme.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
