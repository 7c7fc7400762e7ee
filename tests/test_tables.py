"""``ablate.tables.markdown_table``: the markdown tables of the reports, docs and benches."""

from __future__ import annotations

import pandas as pd

from ablate.tables import markdown_table


def test_cells_stay_as_written_and_pipes_are_escaped():
    text = markdown_table([["a|b", "0.40", "1e-05"], ["c", "12.00", ""]], ["name", "x", "lr"])
    assert text.splitlines()[0] == "| name | x | lr |"
    assert "| a\\|b | 0.40 | 1e-05 |" in text  # no number parsing: 0.40 is not shown as 0.4
    assert "| c | 12.00 |  |" in text


def test_named_columns_are_marked_right_aligned_or_centred_and_cells_stay_unpadded():
    df = pd.DataFrame({"strategy": ["none", "all"], "dev (%)": ["90.10", "8.00"], "ok": ["y", "n"]})
    text = markdown_table(df, right=["dev (%)"], center=["ok"])
    assert text.splitlines() == [
        "| strategy | dev (%) | ok |",
        "|---|--:|:-:|",
        "| none | 90.10 | y |",
        "| all | 8.00 | n |",
    ]


HOSTILE = (
    "x\n| planted | row |\r\n![pixel](http://evil.example/p.png) [click](http://evil.example)"
    " [ref][1] [1]: http://evil.example <img src=x onerror=alert(1)> <http://evil.example> a\\|b"
)


def test_a_hostile_value_stays_text_in_its_own_cell():
    """A value a run's writer chose (an option name, a tag) cannot add rows, links, images or
    HTML to a table that another member reads."""
    text = markdown_table([[HOSTILE, "1"]], ["strategy", "n"])
    header, rule, *body = text.splitlines()
    assert len(body) == 1 and body[0].endswith(" | 1 |")  # one row, its two cells
    cell = body[0][2 : -len(" | 1 |")]
    assert "\\|" in cell and "|" not in cell.replace("\\|", "")  # every pipe escaped
    assert "](" not in cell.replace("\\](", "") and "][" not in cell.replace("\\][", "")
    assert "]:" not in cell.replace("\\]:", "")  # no link definition
    assert "<" not in cell.replace("\\<", "")  # no HTML, no autolink
    assert "a\\\\\\|b" in cell  # a backslash before a pipe escapes neither
    # what is not markup stays as written: an interval's brackets, a header's
    text = markdown_table([["+1.20 [-0.30, +2.70]"]], ["Δ dev vs none (pt) [95 % CI]"])
    assert text.splitlines()[::2] == [
        "| Δ dev vs none (pt) [95 % CI] |",
        "| +1.20 [-0.30, +2.70] |",
    ]
    # the docs' own tables keep their links
    assert "[speed.md](speed.md)" in markdown_table([["[speed.md](speed.md)"]], ["x"], markup=True)
