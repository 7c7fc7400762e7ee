"""``python -m ablate.report`` (``make report``): the comparison report from tracked runs.

Every error is one line that names the fix: the flag that chooses other runs and what the store
holds instead."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ablate.errors import AblateError
from ablate.report.load import EVERY_RUN, FILTERS, MlflowException, load_scope, overview
from ablate.report.render import default_out_dir, write
from ablate.report.summary import BASELINE, build
from ablate.report.sweeps import load_sweeps


def _load(args):
    """The runs in scope: the sweep asked for (several, side by side), else the latest sweep
    that has runs (or, with ``--all`` or when the experiment holds no such sweep, every run)."""
    filters = {key: getattr(args, key) for key in (*FILTERS, "metric")}
    sweep = None if args.all else args.sweep or "latest"
    if isinstance(sweep, list):  # the report's --sweep is repeatable (an archive's is not)
        if len(sweep) > 1:
            return load_sweeps(args.experiment, args.uri, sweep, **filters)
        sweep = sweep[0]
    runs = load_scope(args.experiment, args.uri, sweep, **filters)
    if runs.source.get("sweep") == EVERY_RUN:
        print("no sweep with runs in this experiment: the report covers every run (as --all)")
    return runs


def add_filters(parser: argparse.ArgumentParser, every: str, several: bool = False) -> None:
    """The options that choose a report's runs (``every``: what ``--all`` says it covers;
    ``several``: ``--sweep`` may be repeated, to compare sweeps)."""
    parser.add_argument("--experiment", default="ablate", help="MLflow experiment name")
    scope = parser.add_mutually_exclusive_group()
    side = "; repeat it to compare sweeps side by side, each with its own baseline"
    scope.add_argument(
        "--sweep",
        action="append" if several else "store",
        metavar="DIR",
        help="the runs of this sweep: its multirun folder, or 'latest' (the default: "
        "the newest sweep that has runs)" + (side if several else ""),
    )
    scope.add_argument("--all", action="store_true", help=every)
    for key, meaning in FILTERS.items():
        parser.add_argument(f"--{key}", nargs="+", help=meaning)
    parser.add_argument("--metric", help="primary metric (default: from each run's data.task)")


def _fail(message: object, hint: str = "") -> int:
    text = " ".join(str(message).split())  # one line, whatever the message held
    print(f"error: {text}" + (f"; {hint}" if hint else ""), file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: read runs, write the report, print where it went and what was left out."""
    parser = argparse.ArgumentParser(
        prog="python -m ablate.report",
        description="Comparison report (summary.md, summary.csv, runs.csv, charts; for POS "
        "per_tag.csv and a confusion chart) from tracked MLflow runs.",
    )
    parser.add_argument(
        "--uri",
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///<project>/mlflow.db)",
    )
    add_filters(
        parser, "every run of the experiment, a table per group of equal settings", several=True
    )
    parser.add_argument("--baseline", default=BASELINE, help="strategy to compare against")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: reports/)")
    args = parser.parse_args(argv)
    try:
        runs = _load(args)
    except (AblateError, MlflowException) as exc:
        return _fail(exc)
    try:
        report = build(runs, baseline=args.baseline)
    except AblateError as exc:
        return _fail(exc, overview(runs.source["uri"], args.experiment))
    out = args.out or default_out_dir()
    try:
        paths = write(report, out)
    except OSError as exc:
        return _fail(f"cannot write the report to {out} ({exc}); pass another folder with --out")
    names = ", ".join(p.name for p in paths.values())
    print(
        f"{report.runs.run_id.nunique()} runs used; wrote {names} to {paths['summary.md'].parent}"
    )
    for r in report.excluded.itertuples():
        sweep = f"{r.sweep}: " if "sweep" in report.excluded else ""  # sweeps compared
        name = r.run_name if isinstance(r.run_name, str) else "-"
        print(f"left out: {sweep}{name} ({r.data}/{r.freeze}/s{r.seed}): {r.reason}")
    return 0
