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
