"""Training and evaluation of one prepared run with the Hugging Face Trainer (``conf/trainer``)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from typing import TYPE_CHECKING

import numpy as np
from transformers import EarlyStoppingCallback, PrinterCallback, ProgressCallback

from ablate import plugins
from ablate.errors import AblateError
from ablate.plugins import Context
from ablate.quiet import quieted
from ablate.strategies.base import Applied, build_optimizer
from ablate.tasks import Task
from ablate.tasks.metrics import Evaluation, argmax_logits
from ablate.tracking.recorder import Recorder
from ablate.training import checkpoints, keep
from ablate.training.arguments import training_arguments
from ablate.training.callbacks import EpochLogger, SendEvaluated, StopDiverged, dev_history
from ablate.training.meter import CountingCollator, SpeedMeter
from ablate.training.prepare import Prepared
from ablate.training.progress import TerminalProgress, log_above_bars
from ablate.training.resources import (
    PEAK_RSS_TAG,
    busy_at_start,
    jobs_on_gpu,
    launcher_workers,
    peak_rss_mb,
)
from ablate.training.trainer import CoreTrainer, trainer_class

if TYPE_CHECKING:
    from ablate.config import DataCore, TrainCore

log = logging.getLogger(__name__)


def fit(cfg: TrainCore, prep: Prepared, record: Recorder) -> dict[str, float]:
    """Train on train, evaluate dev every epoch and test (and ``data.extra_test``) at the end;
    record everything. ``trainer.early_stopping_patience`` may end training early."""
    counts = record_inputs(cfg.data, prep, record)
    with checkpoints.folder() as output_dir, quiet_libraries():
        trainer, status = build_trainer(
            cfg,
            prep.task,
            prep.applied,
            prep.encoded.features,
            prep.tokenizer,
            record,
            prep.device,
            output_dir,
        )
        record.tags({checkpoints.FOLDER_TAG: output_dir})
        record.info("speed", status)
        with log_above_bars(trainer):
            out = trainer.train(resume_from_checkpoint=checkpoints.resume_from(record.resumed))
    diverged = next(c for c in trainer.callback_handler.callbacks if isinstance(c, StopDiverged))
    if diverged.verdict:  # nothing of it worth scoring, keeping or resuming
        checkpoints.remove(trainer.args.output_dir, record.resumed)
        raise AblateError(diverged.verdict)
    for folder, write in prep.applied.artifacts.items():  # e.g. the LoRA adapter alone
        with tempfile.TemporaryDirectory() as tmp:
            write(tmp)
            record.artifacts(tmp, folder)
    primary = prep.task.primary_metric
    history = dev_history(trainer.state, primary)
    results: dict[str, float] = {
        **_training_time(trainer, out.metrics),
        f"best_dev_{primary}": max(history),
        "best_epoch": history.index(max(history)) + 1,
        "stopped_epoch": round(trainer.state.epoch or 0),  # the last epoch trained
        "tokenize_time_s": prep.encoded.seconds,
    }
    with quiet_libraries():
        results.update(final_evaluations(trainer, prep, record))
    results["peak_rss_mb"] = peak_rss_mb()
    record.tags({PEAK_RSS_TAG: prep.peak_rss})
    # Metrics already logged are not logged again (a second point, at step 0): the per-epoch dev
    # metrics (the final model's are the last epoch's, or with early stopping the best epoch's:
    # best_dev_*) and counts equal to the split sizes (sst2's <split>_sentences).
    per_epoch = {f"dev_{m}" for m in (primary, *prep.task.epoch_metrics)}
    record.metrics({k: v for k, v in results.items() if k not in per_epoch and counts.get(k) != v})
    if cfg.trainer.keep_model:  # the final model: the last epoch's, or the best one restored
        with quiet_libraries():
            keep.keep(cfg.model, prep.task, prep.applied.model, prep.tokenizer, record)
    checkpoints.remove(trainer.args.output_dir, record.resumed)
    return results


def _training_time(trainer: CoreTrainer, trained: dict[str, float]) -> dict[str, float]:
    """``train_runtime_s`` and ``train_samples_per_s`` of the whole run: the Trainer's count only
    this process's training, which for a run resumed after its last epoch is none at all."""
    meter = next(c for c in trainer.callback_handler.callbacks if isinstance(c, SpeedMeter))
    if not meter.earlier_s:
        return {
            "train_runtime_s": trained["train_runtime"],
            "train_samples_per_s": trained["train_samples_per_second"],
        }
    runtime = meter.earlier_s + trained["train_runtime"]
    return {"train_runtime_s": runtime, "train_samples_per_s": meter.samples / runtime}


def quiet_libraries() -> contextlib.AbstractContextManager:
    """Training's job log without the libraries' repeats: accelerate's note on every evaluation,
    a bar per checkpoint shard."""
    return quieted({"accelerate": logging.WARNING}, bars=("transformers",))


def record_inputs(data: DataCore, prep: Prepared, record: Recorder) -> dict[str, int]:
    """Record what the run trains on: the datasets (of the ``data`` node), their counts, the
    trainable parameters."""
    splits = data.get("splits") or {}
    sources = {}
    for split, path in prep.files.paths.items():
        pinned = splits.get(split)
        source = pinned.url if pinned is not None and pinned.url else str(path)
        sources[split] = (source, prep.files.sha256[split])
    if prep.held_out:  # the test set is part of train's file
        sources["test"] = sources["train"]
    for split, (source, sha) in sources.items():
        record.dataset(f"{data.name}/{split}", source, sha, context=split)
    record.info(
        "data",
        {
            "version": data.version,
            "files": {
                s: {"path": str(p), "sha256": prep.files.sha256[s]}
                for s, p in prep.files.paths.items()
            },
            "test": prep.held_out or "the release's test split",
            "tokenized_cache": prep.encoded.cache,
        },
    )
    # jobs_at_once: the sweep's jobs running beside this one (on a GPU they share it by default)
    record.info(
        "environment",
        {
            "torch_threads": prep.threads,
            "omp_wait_policy": prep.wait_policy,
            "jobs_at_once": launcher_workers(),
        },
    )
    if (sharing := jobs_on_gpu(prep.device)) > 1:  # its times are not its own (the report's *)
        record.metrics({"jobs_on_gpu": sharing})
    if (busy := busy_at_start()) is not None:  # from PASSIVE_FROM on, OpenMP waits passively
        record.metrics({"busy_cpus_at_start": busy})
    stats = prep.encoded.stats  # only what happened: a zero count is no news
    record.metrics({f"{s}_{k}": v for s, c in stats.items() for k, v in c.items() if v})
    counts = {f"{s}_sentences": len(sents) for s, sents in prep.sentences.items()}
    record.metrics(counts)
    a = prep.applied
    record.metrics(
        {
            "trainable_params": a.trainable_params,
            "total_params": a.total_params,
            "trainable_pct": a.trainable_pct,
        }
    )
    record.tags({"freeze.frozen_blocks": a.frozen_blocks})
    log.info(
        "%d / %d params trainable (%.1f %%), frozen blocks %s",
        a.trainable_params,
        a.total_params,
        a.trainable_pct,
        a.frozen_blocks,
    )
    return counts


def build_trainer(
    cfg: TrainCore,
    task: Task,
    applied: Applied,
    features: dict[str, list[dict]],
    tokenizer,
    record: Recorder,
    device: str,
    output_dir: str,
) -> tuple[CoreTrainer, dict[str, str]]:
    """The run's Trainer on ``applied.model``: the core Trainer with what the plugins add (they
    may wrap the model, the features and the collator) and the meter; and what they applied."""
    callbacks = [
        EpochLogger(record, task.primary_metric, task.epoch_metrics),
        StopDiverged(record, len(task.labels)),
        *(make(record) for make in applied.callbacks),
    ]
    ctx = Context(
        cfg,
        task,
        applied,
        applied.model,
        dict(features),
        tokenizer,
        record,
        device,
        task.collator(tokenizer),
        callbacks,
    )
    active = plugins.active()
    fields = {k: v for p in active for k, v in p.arguments(ctx).items()}
    ctx.args = training_arguments(cfg, output_dir, device, **fields)
    status = {k: v for p in active for k, v in p.prepare(ctx).items()}
    # The meter wraps the collator last, outermost: it counts what every wrapper collated.
    ctx.collator = CountingCollator(ctx.collator)
    ctx.callbacks.append(SpeedMeter(record, ctx.collator, bool(cfg.trainer.measure_flops)))
    trainer = trainer_class(ctx.mixins)(
        model=ctx.model,
        args=ctx.args,
        train_dataset=ctx.features["train"],
        eval_dataset=ctx.features["dev"],
        data_collator=ctx.collator,
        processing_class=tokenizer,
        compute_metrics=task.compute_metrics,
        preprocess_logits_for_metrics=argmax_logits,
        callbacks=ctx.callbacks,
    )
    status.update({k: v for p in active for k, v in p.attach(ctx, trainer).items()})
    if applied.param_groups is not None:  # the strategy's optimiser groups (llrd, gradual)
        trainer.optimizer = build_optimizer(trainer, applied.param_groups)
    if cfg.trainer.early_stopping_patience is not None:
        trainer.add_callback(EarlyStoppingCallback(cfg.trainer.early_stopping_patience))
    # The Trainer prints each log dict (3 an epoch), where EpochLogger logs one line; its bars,
    # there where stderr is a terminal (TrainingArguments.disable_tqdm), stay
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(TerminalProgress())
    trainer.add_callback(SendEvaluated(record))  # last: after every callback's evaluation records
    return trainer, status


def _evaluate(trainer: CoreTrainer, prep: Prepared, features: list) -> Evaluation:
    predictions, label_ids = trainer.predictions(features)  # dev: the last epoch's, if current
    return prep.task.evaluate(np.asarray(predictions), np.asarray(label_ids), prep.task.labels)


def final_evaluations(trainer: CoreTrainer, prep: Prepared, record: Recorder) -> dict[str, float]:
    """The final model on dev and test (with reports and predictions) and extra test sets."""
    results: dict[str, float] = {}
    for split in ("dev", "test"):
        features = trainer.eval_dataset if split == "dev" else prep.encoded.features["test"]
        ev = _evaluate(trainer, prep, features)
        results.update({f"{split}_{k}": v for k, v in ev.metrics.items()})
        for name, content in ev.artifacts.items():
            log_artifact = record.text if isinstance(content, str) else record.json
            log_artifact(content, f"reports/{split}_{name}")
        # ids per scored item: dev's for the report's paired bootstrap of Δ vs baseline, test's
        # for error analysis
        record.json(
            {"gold": ev.gold.tolist(), "pred": ev.pred.tolist()}, f"predictions/{split}.json"
        )
    for name, feats in prep.extra.items():  # zero-shot: the final model on other test sets
        ev = _evaluate(trainer, prep, feats)
        results.update({f"test_{k}/{name}": v for k, v in ev.metrics.items()})
    return results
