"""Markdown tables: the one way the reports, the docs' generated blocks and the benches write
them (pandas' ``DataFrame.to_markdown``, through tabulate). Cells are escaped (``inline``): a
run's values are written by whoever logged the run, and a shared store has many writers."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

import pandas as pd

# A `]` that closes a link's text (`[..](..)`, `[..][..]`, an image `![..](..)`) or starts a
# link definition (`[..]: ..`); brackets elsewhere (an interval `[-0.3, +2.7]`) stay as written.
_LINK = re.compile(r"\](?=[(\[:])")


def inline(value: object) -> str:
    """``value`` as text that markdown shows as written, on one line: no row or cell of its
    own (line breaks become spaces, ``|`` escaped), no link or image, no HTML or autolink
    (``<`` escaped); a backslash stays a backslash. For every table cell, heading and note
    that holds a run's values."""
    text = " ".join(str(value).splitlines())
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "\\<")
    return _LINK.sub(r"\\]", text)


def code(value: object) -> str:
    """``value`` as an inline code span that shows it as written, on one line: inside a span
    nothing is a link, an image or HTML, and no backtick of ``value`` can close it (its fence is
    one backtick longer than the longest run of them in ``value``; a value that starts or ends
    with one is padded with a space each side, which markdown takes off again). A plain value is
    ``f"`{value}`"``. For every run's or archive's value the docs write as code; in a table cell,
    ``inline`` escapes it further (a ``|``)."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    spaced = text[:1] == " " and text[-1:] == " " and text.strip(" ")
    pad = " " if not text or text[0] == "`" or text[-1] == "`" or spaced else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _pipes(value: object) -> str:
    return str(value).replace("|", "\\|")


def markdown_table(
    rows: pd.DataFrame | Iterable[Sequence],
    columns: Sequence[str] | None = None,
    *,
    right: Collection[str] = (),
    center: Collection[str] = (),
    markup: bool = False,
) -> str:
    """``rows`` (a DataFrame, or rows of cells under the headers ``columns``) as a pipe table:
    every cell as ``str`` shows it, escaped by ``inline`` (with ``markup``, cells the project
    wrote itself, links and all: only ``|`` escaped); the columns named in ``right`` marked
    right-aligned (``--:``), those in ``center`` centred (``:-:``), the others ``---``."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows), columns=columns)
    marks = ["--:" if c in right else ":-:" if c in center else "---" for c in df.columns]
    cell = _pipes if markup else inline
    # tabulate would read "0.40" as a number and print 0.4: cells stay as the caller wrote them
    text = (
        df.map(cell)
        .rename(columns=cell)
        .to_markdown(
            index=False, tablefmt="pipe", disable_numparse=True, stralign=None, numalign=None
        )
    )
    # to_markdown marks alignment only by padding each column to its widest cell, and rules
    # each column that wide: the README's size budget has no room for that, so cells stay
    # unpadded and the rule is written here
    header, _, *body = text.split("\n")
    return "\n".join([header, "|" + "|".join(marks) + "|", *body])
