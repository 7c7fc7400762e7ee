"""README's computed blocks (trainable-parameter table, Makefile targets) are current."""

from __future__ import annotations

from ablate import docs
from ablate.config import project_root


def test_readme_generated_blocks_are_current():
    text = (project_root() / "README.md").read_text(encoding="utf-8")
    assert "<!-- freeze-table:start -->" in text and "<!-- make-help:start -->" in text
    assert docs.render(text) == text, "README is stale: run `python -m ablate.docs`"
    table = text.split("<!-- freeze-table:start -->")[1].split("<!-- freeze-table:end -->")[0]
    assert "| `freeze=all` |" in table and "| `freeze=none` |" in table


def test_every_makefile_target_is_documented():
    listed = docs.make_help()
    for target in ("help", "setup", "run", "test", "lint", "sweep", "ui", "clean"):
        assert f"`make {target}`" in listed
