"""A fair learning rate per freeze option: one Optuna study each, and the best lr of each.

``python -m ablate.search freeze=lora,bitfit [OVERRIDE ...]`` runs, once per option,
``python -m ablate.train --multirun hparams_search=lr freeze=<option> [OVERRIDE ...]`` (an
in-memory study; every trial an MLflow run tagged ``study=<name>``), then prints the best lr per
option as a markdown table. ``--report-only`` prints the table from the runs already in the store
(with no ``freeze=`` override: every study in the experiment).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from collections.abc import Sequence

from hydra.errors import HydraException
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig

from ablate import config, tasks
from ablate.errors import AblateError
from ablate.overrides import check as check_overrides
from ablate.report.lrsearch import table
from ablate.tracking.lrstudy import Best, Study, all_studies, best
from ablate.tracking.signals import pass_on

PRESET = "hparams_search=lr"


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
    ``hydra`` node (its sweeper's params)."""
    extra = [f"freeze={freeze}"] if freeze else []
    return config.compose(PRESET, *extra, *overrides, hydra=hydra)


def for_studies(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the freeze options to study, the overrides their trials run with).

    The options are those a ``freeze=`` override names, else the preset's ``lr_study.freeze``
    (``experiment=fair``). The trials go to ``lr_study.experiment`` and train at the lr the
    sweeper proposes (``lr_study.freeze=[]``); a preset's own sweep (seeds, freeze options) is
    dropped: the study sweeps the lr alone.
    """
    options, rest = split_freeze(overrides)
    cfg = compose_trial(None, rest, hydra=True)
    options = options or list(cfg.lr_study.freeze)
    rest = [o for o in rest if not o.lstrip("+").startswith("lr_study.freeze=")]
    dropped = [f"~hydra.sweeper.params.{k}" for k in cfg.hydra.sweeper.params if k != "trainer.lr"]
    extra = ["lr_study.freeze=[]", *dropped]
    if cfg.lr_study.experiment:
        extra.append(f"tracking.experiment={cfg.lr_study.experiment}")
    return options, [*rest, *extra]


def study_of(cfg: DictConfig) -> Study:
    """Name and store of the study whose trials run with ``cfg`` (``compose_trial``)."""
    return Study(
        freeze=cfg.freeze.name,
        name=cfg.tracking.tags.study,
        uri=cfg.tracking.uri,
        experiment=cfg.tracking.experiment,
        metric=f"best_dev_{tasks.get(cfg.data.task).primary_metric}",
    )


def searched_range(cfg: DictConfig) -> tuple[float, float] | None:
    """The [low, high] lr interval a study with trials of ``cfg`` (``compose_trial``, with its
    ``hydra`` node) samples: ``lr_study.range``, else its sweeper's ``trainer.lr``
    (hparams_search=lr)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if cfg.lr_study.range:
        low, high = cfg.lr_study.range
        return float(low), float(high)
    param = cfg.hydra.sweeper.params.get("trainer.lr")
    if param is None:
        return None
    sweep = OverridesParser.create().parse_override(f"trainer.lr={param}").value()
    return (float(sweep.start), float(sweep.end)) if hasattr(sweep, "start") else None


def edge_note(b: Best, searched: tuple[float, float] | None) -> str | None:
    """A warning when ``b``'s lr lies in the outer tenth (log scale) of the ``searched`` range:
    the best lr may lie beyond it."""
    if b.lr is None or searched is None:
        return None
    low, high = (math.log10(x) for x in searched)
    where = (math.log10(b.lr) - low) / (high - low)
    if 0.1 <= where <= 0.9:
        return None
    side = "top" if where > 0.9 else "bottom"
    return (
        f"warning: freeze={b.study.freeze}: the best lr {b.lr:.3g} lies in the {side} tenth of "
        f"the searched range [{searched[0]:g}, {searched[1]:g}] (log scale); the best may lie "
        "beyond it: widen it with lr_study.range=[low,high]"
    )


def run_study(freeze: str, overrides: Sequence[str], cfg: DictConfig) -> int:
    """Run ``freeze``'s study (its trials' config ``cfg``) in a child process (one Hydra
    sweep); its exit status."""
    cmd = [sys.executable, "-m", "ablate.train", "--multirun", PRESET, f"freeze={freeze}"]
    if span := cfg.lr_study.range:
        # the Optuna sweeper takes a search space from the command line over its params
        overrides = [*overrides, f"trainer.lr=tag(log,interval({span[0]},{span[1]}))"]
    return subprocess.run([*cmd, *overrides]).returncode


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
        "overrides",
        nargs="*",
        help="Hydra overrides: freeze=a,b (one study each; default: the preset's lr_study.freeze), "
        "data=..., experiment=fair",
    )
    args = parser.parse_args(argv)
    failed = []
    try:
        check_overrides(args.overrides)  # an unknown key or option: before any study runs
        options, overrides = for_studies(args.overrides)
        trials = {o: compose_trial(o, overrides, hydra=True) for o in options or [None]}
        if args.report_only and not options:
            studies = all_studies(study_of(trials[None]))
        else:
            studies = [study_of(cfg) for cfg in trials.values()]
        if not args.report_only:
            pass_on()  # a stop signal reaches the study's sweep, which stops its trials
            for option, cfg in trials.items():
                name = option or studies[0].freeze
                if run_study(name, overrides, cfg) != 0:
                    failed.append(name)
        found = [best(s) for s in studies]
        print(table(found))
        for b, option in zip(found, options, strict=False):
            if note := edge_note(b, searched_range(trials[option])):
                print(note, file=sys.stderr)
    except (AblateError, HydraException, MlflowException) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if failed:
        print(f"error: the study of {', '.join(failed)} failed (see its log)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
