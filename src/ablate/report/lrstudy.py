"""The lr study's table (``python -m ablate.lrstudy``): per study, its trials, those pruned and
the epochs that saved, and the best trial's lr and objective (``ablate.lrstudy.runs`` reads them
from the store)."""

from __future__ import annotations

from collections.abc import Sequence

from ablate.lrstudy.runs import Best
from ablate.tables import markdown_table


def table(rows: Sequence[Best]) -> str:
    """The best lr per option as a markdown table."""
    cells = []
    for b in rows:
        trials = f"{b.trials}" + (
            f" (+{b.other_settings} with other settings, not compared)" if b.other_settings else ""
        )
        cells.append(
            (
                b.study.freeze,
                b.study.name,
                trials,
                str(b.pruned),
                str(b.epochs_saved),
                f"{b.lr:.3g}" if b.lr is not None else "-",
                b.study.metric,
                f"{b.value:.4f}" if b.value is not None else "-",
                b.run_id or "-",
            )
        )
    columns = [
        "freeze",
        "study",
        "finished",
        "pruned",
        "epochs saved",
        "best lr",
        "objective",
        "best value",
        "run",
    ]
    return markdown_table(cells, columns)
