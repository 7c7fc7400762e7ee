"""``python -m ablate.train [--multirun] key=value ...``: one Hydra job = one MLflow run.

Only Hydra, the config schema and the extensions (``ablate_plugins``) are imported up front, so
``--help`` and configuration errors answer at once; the training stack is imported when a job
runs.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from ablate import config, extensions

log = logging.getLogger("ablate")
extensions.load()  # before Hydra composes: an extension's switches join the schema


@hydra.main(version_base="1.3", config_path=str(config.conf_dir()), config_name="train")
def main(cfg: DictConfig) -> float:
    """Train and evaluate one configuration; returns the best dev score of the task's primary
    metric, ``best_dev_<primary>`` (the sweepers' objective)."""
    from ablate import tasks
    from ablate.errors import AblateError
    from ablate.tracking import run as tracking

    try:
        primary = tasks.get(cfg.data.task).primary_metric
        if cfg.skip_finished and (twin := tracking.finished_twin(cfg)) is not None:
            log.info(
                "skip_finished: identical config already FINISHED as run %s (%s); skipping",
                twin.info.run_name, twin.info.run_id,
            )  # fmt: skip
            return twin.data.metrics.get(f"best_dev_{primary}", float("nan"))
        from ablate.training.resources import set_wait_policy

        set_wait_policy(cfg)  # before torch loads OpenMP
        from ablate.training.fit import fit
        from ablate.training.prepare import prepare

        prepared = prepare(cfg)  # everything checked before a run is opened
        with tracking.start_run(cfg, prepared.files.sha256) as run:
            results = fit(cfg, prepared, run)
    except AblateError as exc:
        log.error("%s", exc)
        if tracking.in_multirun():
            raise  # the sweep records this job as failed and goes on
        raise SystemExit(2) from None  # one line, no traceback, for a single run
    uri = cfg.tracking.uri
    where = f"open {uri}" if uri.startswith("http") else "browse it with: make ui"
    log.info(
        "run %s FINISHED: dev %s %.4f, test %s %.4f. Store: %s (experiment %r); %s",
        tracking.run_name(cfg), primary, results[f"dev_{primary}"], primary,
        results[f"test_{primary}"], uri, cfg.tracking.experiment, where,
    )  # fmt: skip
    return results[f"best_dev_{primary}"]


if __name__ == "__main__":
    main()
