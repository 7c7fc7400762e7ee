"""The lr study's command: a fair learning rate per freeze option, one Optuna study each, and
the best lr of each.

``python -m ablate.lrstudy freeze=lora,bitfit [OVERRIDE ...]`` runs, once per option, its lr study
(``ablate.lrstudy.study``: ``lr_study.trials`` trials over ``lr_study.range``, each a
``python -m ablate.train lr_study=trial freeze=<option> trainer.lr=<lr> [OVERRIDE ...]`` run
tagged ``study=<name>``; persistent, so the same command continues a killed study and several
workers can share one), then prints per study its trials, those pruned and the epochs saved,
and the best lr per option as a markdown table. ``--report-only`` prints the table from the runs
already in the store (with no ``freeze=`` override: every study in the experiment).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.errors import HydraException
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig
from optuna.exceptions import OptunaError
from sqlalchemy.exc import SQLAlchemyError

from ablate import config, tasks
from ablate.errors import AblateError
from ablate.lrstudy import study
from ablate.lrstudy.runs import Study, all_studies, best
from ablate.lrstudy.table import edge_notes, table
from ablate.overrides import check as check_overrides
from ablate.tracking.signals import pass_on


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


def compose_trial(freeze: str | None, overrides: Sequence[str], hydra: bool = False) -> DictConfig:
    """The configuration a trial of ``freeze``'s study runs with (lr aside); ``hydra``: with the
    ``hydra`` node (where its job folders go)."""
    extra = [f"freeze={freeze}"] if freeze else []
    return config.compose(study.PRESET, *extra, *overrides, hydra=hydra)


def for_studies(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the freeze options to study, the overrides their trials run with).

    The options are those a ``freeze=`` override names, else the preset's ``lr_study.freeze``
    (``experiment=fair``). The trials go to ``lr_study.experiment`` and train at the lr the
    study proposes (``lr_study.freeze=[]``); each trial is a single run, so a preset's own sweep
    (seeds, freeze options) does not apply to it.
    """
    for item in overrides:
        if item.lstrip("+~").startswith("hydra.sweeper."):
            raise AblateError(
                f"{item}: an lr study is not a Hydra sweep: for its size use lr_study.trials=N "
                "(its range: lr_study.range=[low,high])"
            )
    options, rest = split_freeze(overrides)
    cfg = compose_trial(None, rest)
    options = options or list(cfg.lr_study.freeze)
    rest = [o for o in rest if not o.lstrip("+").startswith("lr_study.freeze=")]
    extra = ["lr_study.freeze=[]"]
    if cfg.lr_study.experiment:
        extra.append(f"tracking.experiment={cfg.lr_study.experiment}")
    return options, [*rest, *extra]


def study_of(cfg: config.TrainCore) -> Study:
    """Name and store of the study whose trials run with ``cfg`` (``compose_trial``)."""
    return Study(
        freeze=cfg.freeze.name,
        name=cfg.tracking.tags.study,
        uri=cfg.tracking.uri,
        experiment=cfg.tracking.experiment,
        metric=f"best_dev_{tasks.get(cfg.data.task).primary_metric}",
    )


def run_studies(options: list[str], overrides: list[str]) -> dict[str, str]:
    """Run each option's study; print what each did and where its best lr lies. The options
    whose study failed, each with where to read why (``_where_failed``)."""
    failed = {}
    pass_on()  # a stop signal reaches the trial running, which closes its run KILLED
    for option in options:
        cfg = compose_trial(option, overrides, hydra=True)
        folder = Path(cfg.hydra.sweep.dir) / option
        trial_overrides = [o for o in overrides if not o.startswith("hydra.run.dir=")]
        try:
            done = study.run(compose_trial(option, overrides), trial_overrides, folder)
        except AblateError as exc:
            print(f"error: freeze={option}: {exc}", file=sys.stderr)
            failed[option] = _where_failed(folder)
            continue
        print(done.line(), file=sys.stderr)
    return failed


def _where_failed(folder: Path) -> str:
    """Where to read why a study failed: the job log of its last trial (under ``folder``), or
    where none was written (it failed before, or its trial before Hydra started), its error."""
    logs = sorted(folder.glob("*/*.log"), key=lambda p: p.stat().st_mtime)
    if logs:
        return f"see its job log {logs[-1]}"
    return f"no trial wrote a job log under {folder}: its error is above"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m ablate.lrstudy",
        description="Tune the learning rate per freeze option (one Optuna study each) on dev, "
        "then print the best lr per option.",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="print the table from the store; run nothing"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides: freeze=a,b (one study each; default: the preset's lr_study.freeze), "
        "lr_study.trials=N, data=..., experiment=fair",
    )
    args = parser.parse_args(argv)
    failed: dict[str, str] = {}
    try:
        check_overrides(args.overrides)  # an unknown key or option: before any study runs
        options, overrides = for_studies(args.overrides)
        trials = {o: compose_trial(o, overrides) for o in options or [None]}
        for cfg in trials.values() if not args.report_only else ():
            study.check(cfg)  # every study's keys, before the first one runs
        if args.report_only and not options:
            studies = all_studies(study_of(trials[None]))
        else:
            studies = [study_of(cfg) for cfg in trials.values()]
        if not args.report_only:
            failed = run_studies(options, overrides)
        found = [best(s) for s in studies]
        print(table(found))
        for note in edge_notes(found):  # last, where a reader looks, not mid-log
            print(note, file=sys.stderr)
    except (AblateError, HydraException, MlflowException, OptunaError, SQLAlchemyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the same command continues the study", file=sys.stderr)
        return 130
    for option, where in failed.items():
        print(f"error: the study of {option} failed: {where}", file=sys.stderr)
    if failed:
        return 1
    return 0
