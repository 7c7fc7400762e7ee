"""Where the published studies live (``docs/results/<study>/``): their folders, reports,
archives and the experiments they are run as, and which strategies a study still lacks."""

from __future__ import annotations

from pathlib import Path

from ablate.config import project_root

RESULTS = "naija"  # the README's study: docs/results/<name>/, a report made by make report
# a study run as an experiment of its own (conf/experiment/): its sweep lists the strategies
# the study is to hold, and its rows rerun with it; the other studies are experiment=paper's grid
EXPERIMENT = {"naija-fair": "fair", "ewt-fair": "fair_ewt"}


class NoResults(Exception):
    """The published study's report is not there (yet)."""


def study_dir(study: str) -> Path:
    """A published report's folder: ``docs/results/<study>``, or ``study`` where it is one."""
    return Path(study) if Path(study).is_absolute() else project_root() / "docs" / "results" / study


def csv_rows(study: str, name: str = "summary.csv") -> list[dict[str, str]]:
    """The rows of a published report's csv file (``summary.csv``, ``runs.csv``); one panel only
    (one dataset and model)."""
    import csv

    file = study_dir(study) / name
    path = file.relative_to(project_root()) if file.is_relative_to(project_root()) else file
    if not file.is_file():
        raise NoResults(f"_No published study yet: `{path}` is missing (see docs/results/)._")
    with file.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if len({r["panel"] for r in rows}) > 1:
        raise ValueError(f"{path}: more than one panel; make the report with --data <one>")
    return rows


ARCHIVE = "archive"  # a study's archive: docs/results/<study>/archive/ (python -m ablate.archive)
# the runs of a study rerun so far, archived while the rest still runs (docs/results/<study>/)
PARTIAL = "partial-archive"
# a redone study's report as published (its summary.csv, runs.csv), kept once its archive is
# complete and the report beside the page is the archive's
PUBLISHED = "published"


def current_runs(held) -> list:
    """An archive's runs (not its sweeps, nor its lr-study trials) as the report takes them: the
    FINISHED ones, per dataset, model and strategy those with its latest run's settings (a
    strategy redone at a new lr supersedes its earlier runs), of each seed the latest (a rerun
    with ``skip_finished=false`` supersedes the earlier run); by start time."""
    from ablate.tracking.params import settings

    role = {entry["run_id"]: entry["role"] for entry in held.index["runs"]}
    runs = sorted(
        (r for r in held.runs if role[r.run_id] == "run" and r.info.get("status") == "FINISHED"),
        key=lambda r: r.info.get("start_time") or 0,
    )

    latest = {cell(r): settings(r.params) for r in runs}
    runs = [r for r in runs if settings(r.params) == latest[cell(r)]]
    last = {(cell(r), r.params.get("seed")): r for r in runs}
    return [r for r in runs if last[cell(r), r.params.get("seed")] is r]


def cell(run) -> tuple:
    """A run's dataset, model and strategy, as the report names them."""
    from ablate.report.load import param_name

    return tuple(param_name(run.params, k) for k in ("data", "model", "freeze"))


def still_to_run(study: str, done: set[str]) -> list[str]:
    """The strategies of the experiment ``study`` is run as (``EXPERIMENT``; its sweep's
    ``freeze`` list) not in ``done``, in the sweep's order; none for another study."""
    from omegaconf import OmegaConf

    if (experiment := EXPERIMENT.get(study_dir(study).name)) is None:
        return []
    conf = OmegaConf.load(project_root() / "conf" / "experiment" / f"{experiment}.yaml")
    wanted = str(conf.hydra.sweeper.params.freeze).split(",")
    return [s for s in wanted if s not in done]


def still_said(study: str, done: set[str]) -> str:
    """The sentence naming what ``still_to_run`` finds; empty where nothing is left."""
    left = still_to_run(study, done)
    return f"Still to run: {', '.join(f'`{s}`' for s in left)}." if left else ""


def held_strategies(folder: Path) -> set[str]:
    """The strategies of the runs in the archive beside a page, as the report takes them."""
    from ablate.archive import read

    return {run.params.get("freeze.name") for run in current_runs(read(folder / ARCHIVE))}
