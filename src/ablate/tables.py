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
    every cell as ``str`` shows it, ``|`` escaped; the columns named in ``right`` right-aligned
    (``--:``), those in ``center`` centred (``:-:``), the others unmarked and unpadded."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows), columns=columns)
    align = ["right" if c in right else "center" if c in center else None for c in df.columns]
    # tabulate would read "0.40" as a number and print 0.4: cells stay as the caller wrote them
    return (
        df.map(_cell)
        .rename(columns=_cell)
        .to_markdown(index=False, tablefmt="pipe", disable_numparse=True, colalign=align)
    )
