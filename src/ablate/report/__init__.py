"""The comparison report, built only from tracked MLflow runs (``python -m ablate.report``).

``load_runs`` reads an experiment into tidy tables (``load``), by default the latest sweep that
has runs, a sweep's reused runs included (``scope``, ``load_scope``: as ``make report``
and the notebook choose them); ``build`` turns them into a summary per
dataset with intervals vs the ``none`` baseline, each panel's settings beyond the defaults in
words (``recipe``), and lists every run it leaves out (``summary``, ``cell``, ``stats``);
``write`` saves ``summary.csv``, ``summary.md``, ``runs.csv`` and one PNG per chart (``render``,
``charts``); a word-tagging task's per-tag accuracy and confusions (``per_tag``); several sweeps
side by side (``load_sweeps``, ``sweeps``). ``notebooks/compare.ipynb`` calls the same
functions; ``lrstudy`` is the lr study's table. Imports nothing of the training code.
"""

from ablate.report.load import Runs, describe_source, load_runs, load_scope
from ablate.report.render import CHARTS, default_out_dir, markdown, table, write
from ablate.report.stats import bootstrap_interval, load_predictions, t_interval
from ablate.report.summary import (
    BASELINE,
    STRATEGY_ORDER,
    Report,
    build,
    make_report,
    settings,
    strategy_order,
)
from ablate.report.sweeps import load_sweeps

__all__ = [
    "BASELINE",
    "CHARTS",
    "STRATEGY_ORDER",
    "Report",
    "Runs",
    "bootstrap_interval",
    "build",
    "default_out_dir",
    "describe_source",
    "load_predictions",
    "load_runs",
    "load_scope",
    "load_sweeps",
    "make_report",
    "markdown",
    "settings",
    "strategy_order",
    "table",
    "t_interval",
    "write",
]
