"""A fair learning rate per freeze option: one Optuna study each, and the best lr of each.

``python -m ablate.search freeze=lora,bitfit [OVERRIDE ...]`` runs, once per option,
``python -m ablate.train --multirun hparams_search=lr freeze=<option> [OVERRIDE ...]`` (an
in-memory study; every trial an MLflow run tagged ``study=<name>``), then prints the best lr per
option as a markdown table. ``--report-only`` prints the table from the runs already in the store
(with no ``freeze=`` override: every study in the experiment).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig

from ablate import config, report, tasks
from ablate.errors import AblateError
from ablate.tracking import MlflowClient, MlflowException

PRESET = "hparams_search=lr"


@dataclass(frozen=True)
class Study:
    """Where one option's study keeps its trials."""

    freeze: str
    name: str
    uri: str
    experiment: str
    metric: str  # the objective, as logged: best_dev_<primary metric>


@dataclass(frozen=True)
class Best:
    """The best trial of a study."""

    study: Study
    trials: int  # finished trials compared: those with the latest trial's settings
    lr: float | None
    value: float | None
    run_id: str | None
    other_settings: int = 0  # finished trials of the same name run with other settings


def split_freeze(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(freeze options named by a ``freeze=a,b`` override, the other overrides)."""
    options: list[str] = []
    rest = []
    for item in overrides:
        if item.startswith("freeze="):
            value = item.removeprefix("freeze=").strip("[]")
            options += [o.strip() for o in value.split(",") if o.strip()]
        else:
            rest.append(item)
    return options, rest


def compose_trial(freeze: str | None, overrides: Sequence[str]) -> DictConfig:
    """The configuration a trial of ``freeze``'s study runs with (lr aside)."""
    with initialize_config_dir(config_dir=str(config.conf_dir()), version_base="1.3"):
        extra = [f"freeze={freeze}"] if freeze else []
        return compose("train", overrides=[PRESET, *extra, *overrides])


def study_of(freeze: str | None, overrides: Sequence[str]) -> Study:
    """Name and store of the study that ``freeze`` with ``overrides`` runs."""
    cfg = compose_trial(freeze, overrides)
    return Study(
        freeze=cfg.freeze.name,
        name=cfg.tracking.tags.study,
        uri=cfg.tracking.uri,
        experiment=cfg.tracking.experiment,
        metric=f"best_dev_{tasks.get(cfg.data.task).primary_metric}",
    )


def run_study(freeze: str, overrides: Sequence[str]) -> int:
    """Run ``freeze``'s study in a child process (one Hydra sweep); its exit status."""
    cmd = [sys.executable, "-m", "ablate.train", "--multirun", PRESET, f"freeze={freeze}"]
    return subprocess.run([*cmd, *overrides]).returncode


def _runs(study: Study, filter_string: str):
    client = MlflowClient(tracking_uri=study.uri)
    exp = client.get_experiment_by_name(study.experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50000)


def _recipe(run) -> dict[str, str]:
    return {k: v for k, v in report.settings(run.data.params).items() if k != "trainer.lr"}


def best(study: Study) -> Best:
    """The finished trial of ``study`` with the highest objective, and how many finished.

    The study's name says only data, model and freeze option; trials run with other settings
    (an earlier search with other epochs, say) are left out, as the latest trial's settings
    decide, the way the report treats seeds.
    """
    name = study.name.replace("'", "\\'")
    runs = _runs(study, f"tags.study = '{name}' and attributes.status = 'FINISHED'")
    scored = sorted(
        (r for r in runs if study.metric in r.data.metrics), key=lambda r: r.info.start_time
    )
    if not scored:
        return Best(study, 0, None, None, None)
    latest = _recipe(scored[-1])
    same = [r for r in scored if _recipe(r) == latest]
    top = max(same, key=lambda r: r.data.metrics[study.metric])
    return Best(
        study,
        len(same),
        float(top.data.params["trainer.lr"]),
        top.data.metrics[study.metric],
        top.info.run_id,
        len(scored) - len(same),
    )


def all_studies(template: Study) -> list[Study]:
    """Every study with trials in ``template``'s experiment, by name."""
    runs = _runs(template, "tags.study != ''")
    found = {}
    for r in runs:
        name = r.data.tags.get("study")
        task = r.data.params.get("data.task")
        if name and name not in found and task in tasks.TASKS:
            found[name] = Study(
                r.data.params.get("freeze", "?"), name, template.uri, template.experiment,
                f"best_dev_{tasks.get(task).primary_metric}",  # each study its task's objective
            )  # fmt: skip
    return [found[n] for n in sorted(found)]


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


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m ablate.search",
        description="Tune the learning rate per freeze option (one Optuna study each) on dev, "
        "then print the best lr per option.",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="print the table from the store; run nothing"
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides: freeze=a,b (one study each), data=..."
    )
    args = parser.parse_args(argv)
    options, overrides = split_freeze(args.overrides)
    failed = []
    try:
        if args.report_only and not options:
            studies = all_studies(study_of(None, overrides))
        else:
            studies = [study_of(o, overrides) for o in options or [None]]
        if not args.report_only:
            for option in options or [studies[0].freeze]:
                if run_study(option, overrides) != 0:
                    failed.append(option)
        print(table([best(s) for s in studies]))
    except (AblateError, HydraException, MlflowException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if failed:
        print(f"error: the study of {', '.join(failed)} failed (see its log)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
