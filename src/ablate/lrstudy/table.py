"""The lr study's table (``python -m ablate.lrstudy``): per study, its trials trained out, those
pruned and the epochs that saved, the range searched, the best trial's lr, where it lies in that
range and whether that is interior, and its objective (``ablate.lrstudy.runs`` reads them from the
store)."""

from __future__ import annotations

from collections.abc import Sequence

from ablate.lrstudy import position
from ablate.lrstudy.runs import Best
from ablate.tables import markdown_table

COLUMNS = [
    "freeze",
    "study",
    "finished",
    "pruned",
    "epochs saved",
    "searched",
    "best lr",
    "where",
    "interior",
    "objective",
    "best value",
    "run",
]


def table(rows: Sequence[Best]) -> str:
    """The best lr per option as a markdown table; a best lr in the searched range's outer
    tenths (log scale) says **no** under interior."""
    cells = []
    for b in rows:
        trials = f"{b.trials}" + (
            f" (+{b.other_settings} with other settings, not compared)" if b.other_settings else ""
        )
        where = f"{position(b.lr, b.span):.2f}" if b.interior is not None else "-"
        inside = {True: "yes", False: "**no**", None: "-"}[b.interior]
        cells.append(
            (
                b.study.freeze,
                b.study.name,
                trials,
                str(b.pruned),
                str(b.epochs_saved),
                f"[{b.span[0]:g}, {b.span[1]:g}]" if b.span else "-",
                f"{b.lr:.3g}" if b.lr is not None else "-",
                where,
                inside,
                b.study.metric,
                f"{b.value:.4f}" if b.value is not None else "-",
                b.run_id or "-",
            )
        )
    return markdown_table(cells, COLUMNS)


def edge_notes(rows: Sequence[Best]) -> list[str]:
    """One warning per study whose best lr is not interior to the range it searched."""
    return [
        f"warning: freeze={b.study.freeze}: the best lr {b.lr:.3g} lies at the edge of the "
        f"searched range [{b.span[0]:g}, {b.span[1]:g}] (where {position(b.lr, b.span):.2f}, log "
        "scale): it is not interior; the best may lie beyond it (lr_study.widen, lr_study.range)"
        for b in rows
        if b.interior is False
    ]
