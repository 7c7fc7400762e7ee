"""The learning-rate search's table: per study, the best trial's lr and objective
(``ablate.tracking.lrstudy`` reads them from the store)."""

from __future__ import annotations

from collections.abc import Sequence

from ablate.tracking.lrstudy import Best


def table(rows: Sequence[Best]) -> str:
    """The best lr per option as a markdown table."""
    lines = [
        "| freeze | study | trials | best lr | objective | best value | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in rows:
        lr = f"{b.lr:.3g}" if b.lr is not None else "-"
        value = f"{b.value:.4f}" if b.value is not None else "-"
        run = b.run_id or "-"
        trials = f"{b.trials}" + (
            f" (+{b.other_settings} with other settings, not compared)" if b.other_settings else ""
        )
        lines.append(
            f"| {b.study.freeze} | {b.study.name} | {trials} | {lr} | {b.study.metric} | {value} "
            f"| {run} |"
        )
    return "\n".join(lines)
