"""``python -m ablate.train [--multirun] key=value ...``: one Hydra job = one MLflow run.

Only Hydra, the config schema and the extensions (``ablate.extensions``) are imported up front, so
``--help`` and configuration errors answer at once; the training stack is imported when a job
runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from ablate import cli, config

if TYPE_CHECKING:
    from ablate.config import FreezeConfig

log = logging.getLogger("ablate")
config.register()  # before Hydra composes: an extension added since joins the schema


@cli.strict  # a bad override: one line, exit 2, before Hydra composes or a sweep opens
@hydra.main(version_base="1.3", config_path=str(config.conf_dir()), config_name="train")
def main(cfg: DictConfig) -> float:
    """Train and evaluate one configuration; returns the best dev score of the task's primary
    metric, ``best_dev_<primary>`` (the sweepers' objective)."""
    from ablate import tasks
    from ablate.data.files import check_folders
    from ablate.errors import AblateError
    from ablate.overrides import check_values
    from ablate.tracking import run as tracking
    from ablate.tracking import ui_links

    run = None  # the MLflow run, once it is open
    try:
        # what the command line's checks leave to the job (a sweep over a data key), before
        # anything reads the data node or opens the store
        check_values(cfg)
        check_folders(cfg.data)
        primary = tasks.get(cfg.data.task).primary_metric
        if cfg.freeze.name in cfg.lr_study.freeze:
            take_tuned_lr(cfg)  # before the twin check: the lr is part of the identity
        if cfg.skip_finished and (twin := tracking.finished_twin(cfg)) is not None:
            log.info(
                "skip_finished: identical config already FINISHED as run %s (%s); skipping",
                twin.info.run_name,
                twin.info.run_id,
            )
            tracking.reused(twin)  # the sweep reports over it as one of its runs
            return twin.data.metrics.get(f"best_dev_{primary}", float("nan"))
        from ablate.training.resources import assign_gpu, set_wait_policy

        set_wait_policy(cfg.trainer)  # before torch loads OpenMP
        if (gpu := assign_gpu()) is not None:  # worker i takes GPU i mod N, before CUDA starts
            log.info("%s", gpu)
        from ablate.strategies import STRATEGIES, check_keys
        from ablate.strategies.peft_methods import untuned_lr
        from ablate.training import checkpoints
        from ablate.training.fit import fit
        from ablate.training.prepare import prepare

        if cfg.freeze.strategy in STRATEGIES:  # a freeze key it ignores: before the data loads
            check_keys(cfg.freeze)
        if note := untuned_lr(cfg, _option(cfg.freeze)):  # a peft method at an lr no study chose
            log.info("%s", note)
        prepared = prepare(cfg)  # everything checked before a run is opened
        keys = STRATEGIES[cfg.freeze.strategy].keys
        with tracking.start_run(cfg, prepared.files.sha256, keys, checkpoints.resumable) as run:
            results = fit(cfg, prepared, run)
    except KeyboardInterrupt:
        _interrupted(cfg, run)
        raise SystemExit(130) from None
    except AblateError as exc:
        log.error("%s", exc)
        if tracking.in_multirun():
            raise  # the sweep records this job as failed and goes on
        raise SystemExit(2) from None  # one line, no traceback, for a single run
    from ablate.lrstudy import PRUNED_EPOCH_TAG, pruned

    uri = cfg.tracking.uri
    where = ui_links.where_to_browse(uri, run.experiment_id, run.id)
    # a pruned trial's run ends as every run does; its study then marks it KILLED
    ended = (
        f"pruned by its lr study after epoch {run.tagged.get(PRUNED_EPOCH_TAG)}"
        if pruned(run.tagged)
        else "FINISHED"
    )
    log.info(
        "run %s %s: dev %s %.4f, test %s %.4f. Store: %s (experiment %r); %s",
        tracking.run_name(cfg),
        ended,
        primary,
        results[f"dev_{primary}"],
        primary,
        results[f"test_{primary}"],
        uri,
        cfg.tracking.experiment,
        where,
    )
    return results[f"best_dev_{primary}"]


def _interrupted(cfg: config.TrainCore, run) -> None:
    """Ctrl-C: one line that says where the run stands and the command that continues it; the
    traceback goes to the job log only."""
    import shlex
    import traceback

    from ablate.training import checkpoints

    for handler in logging.getLogger().handlers:  # Hydra's job log file, not the console
        if isinstance(handler, logging.FileHandler):
            handler.stream.write(traceback.format_exc())
            handler.flush()
    if run is None:
        log.error("interrupted before the run opened: nothing was recorded")
        return
    from hydra.core.hydra_config import HydraConfig

    from ablate.tracking.run import run_name

    given = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    resume = [] if "trainer.resume=true" in given else ["trainer.resume=true"]
    command = shlex.join(["python", "-m", "ablate.train", *given, *resume])
    done = checkpoints.epochs_done(checkpoints.job_path() or "") if cfg.trainer.checkpoints else 0
    if done:
        where = f"after {done} of {cfg.trainer.epochs} epochs; continue it with"
    else:
        why = "trainer.checkpoints=false" if not cfg.trainer.checkpoints else "first epoch"
        where = f"before an epoch checkpoint ({why}); start it over with"
    log.error("run %s (%s) KILLED %s: %s", run_name(cfg), run.id, where, command)


def _option(freeze: FreezeConfig) -> str:
    """The ``freeze`` option the job composed (``freeze.name`` outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.choices.get("freeze") or freeze.name
    return freeze.name


def take_tuned_lr(cfg: config.TrainCore) -> None:
    """Set ``trainer.lr`` to the lr that the strategy's own study picked on dev
    (``lr_study``), tag the run with that trial's id, and record the lr in the job's
    ``.hydra/config.yaml``, so the job folder says what ran."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from ablate.lrstudy import EDGE_TAG, position
    from ablate.lrstudy.runs import study_command, tuned_lr

    best = tuned_lr(cfg, study_command(cfg.freeze))
    log.info(
        "freeze=%s trains at lr %.3g: the best of %d finished trials (pruned ones aside) of "
        "study %s (dev %.4f, run %s)",
        cfg.freeze.name,
        best.lr,
        best.trials,
        best.study.name,
        best.value,
        best.run_id,
    )
    with open_dict(cfg):
        cfg.tracking.tags[config.RECIPE_LR_TAG] = str(cfg.trainer.lr)
        cfg.tracking.tags[config.TUNED_TAG] = best.run_id
        cfg.trainer.lr = best.lr
        if best.interior is False:  # the run says so, and the report flags its strategy's lr
            where = f"{position(best.lr, best.span):.2f} of [{best.span[0]:g}, {best.span[1]:g}]"
            cfg.tracking.tags[EDGE_TAG] = where
            log.warning(
                "freeze=%s: the study's pick %.3g lies at the edge of its searched range (%s, "
                "log scale): the best may lie beyond it",
                cfg.freeze.name,
                best.lr,
                where,
            )
    if HydraConfig.initialized() and (sub := HydraConfig.get().output_subdir) is not None:
        saved = Path(HydraConfig.get().runtime.output_dir) / sub / "config.yaml"
        if saved.parent.is_dir():
            OmegaConf.save(cfg, saved)


if __name__ == "__main__":
    main()
