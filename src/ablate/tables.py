"""Markdown tables: the one way the reports, the docs' generated blocks and the benches write
them (pandas' ``DataFrame.to_markdown``, through tabulate)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import pandas as pd


def _cell(value) -> str:
    return str(value).replace("|", "\\|")


def markdown_table(
    rows: pd.DataFrame | Iterable[Sequence],
    columns: Sequence[str] | None = None,
    *,
    right: Collection[str] = (),
    center: Collection[str] = (),
) -> str:
    """``rows`` (a DataFrame, or rows of cells under the headers ``columns``) as a pipe table:
    every cell as ``str`` shows it, ``|`` escaped; the columns named in ``right`` marked
    right-aligned (``--:``), those in ``center`` centred (``:-:``), the others ``---``."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows), columns=columns)
    marks = ["--:" if c in right else ":-:" if c in center else "---" for c in df.columns]
    # tabulate would read "0.40" as a number and print 0.4: cells stay as the caller wrote them
    text = (
        df.map(_cell)
        .rename(columns=_cell)
        .to_markdown(
            index=False, tablefmt="pipe", disable_numparse=True, stralign=None, numalign=None
        )
    )
    # to_markdown marks alignment only by padding each column to its widest cell, and rules
    # each column that wide: the README's size budget has no room for that, so cells stay
    # unpadded and the rule is written here
    header, _, *body = text.split("\n")
    return "\n".join([header, "|" + "|".join(marks) + "|", *body])
