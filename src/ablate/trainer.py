"""Training and evaluation of one run with the Hugging Face Trainer (``conf/trainer``)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import EarlyStoppingCallback, TrainingArguments, set_seed

from ablate import (
    cache,
    data,
    dropout,
    embedding_rows,
    freeze,
    labels,
    metrics,
    prefix,
    speed,
    tasks,
    tracking,
)
from ablate import model as model_lib
from ablate.errors import AblateError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _checkpoint_folder() -> Iterator[str]:
    """The Trainer's output folder: the job's ``trainer/`` under Hydra, else a new temp folder.

    A run that fails before its first checkpoint leaves nothing in it to resume from, so the
    empty folder is removed; one with checkpoints stays for ``trainer.resume``.
    """
    if HydraConfig.initialized():
        folder = str(Path(HydraConfig.get().runtime.output_dir) / "trainer")
    else:
        folder = tempfile.mkdtemp(prefix="ablate-")
    try:
        yield folder
    except BaseException:
        with contextlib.suppress(OSError):  # not empty (checkpoints) or never created
            Path(folder).rmdir()
        raise


def training_arguments(cfg: DictConfig, output_dir: str) -> TrainingArguments:
    """TrainingArguments from ``trainer`` and ``seed``: dev evaluation and logging per epoch."""
    t = cfg.trainer
    return TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=t.epochs,
        learning_rate=t.lr,
        per_device_train_batch_size=t.batch_size,
        per_device_eval_batch_size=t.eval_batch_size,
        weight_decay=t.weight_decay,
        warmup_steps=float(t.warmup_ratio),  # a float in [0, 1) is a ratio in transformers 5
        eval_strategy="epoch",
        logging_strategy="epoch",
        # One checkpoint (the last epoch's) so a killed run can resume; removed once it finishes.
        # Early stopping restores the best epoch's, so it needs them whatever trainer.checkpoints.
        save_strategy="epoch" if t.checkpoints or t.early_stopping_patience is not None else "no",
        save_total_limit=1,
        **early_stopping_arguments(cfg),
        report_to="none",
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=not sys.stderr.isatty(),  # progress bars only for people, not job logs
        **speed.training_kwargs(t),  # sampler, fused AdamW, bf16/TF32/pinned memory (ablate.speed)
    )


def early_stopping_arguments(cfg: DictConfig) -> dict:
    """TrainingArguments for ``trainer.early_stopping_patience`` ({} when null): track the task's
    primary dev metric and load the best epoch's checkpoint when training ends.

    With ``save_total_limit=1`` the Trainer still keeps the best checkpoint besides the last.
    """
    patience = cfg.trainer.early_stopping_patience
    if patience is None:
        return {}
    if patience < 1:
        raise AblateError(
            f"trainer.early_stopping_patience={patience}: must be a positive number of epochs "
            f"(or null: off)"
        )
    return {
        "load_best_model_at_end": True,
        "metric_for_best_model": f"eval_{tasks.get(cfg.data.task).primary_metric}",
        "greater_is_better": True,
    }


def read_extra_tests(cfg: DictConfig, task: tasks.Task) -> dict[str, list]:
    """The ``data.extra_test`` files, read and label-checked, by name: the file's folder (e.g.
    ``UD_English-EWT``). A path is absolute, or relative to the working directory or ``data.root``.
    """
    paths = list(cfg.data.extra_test or [])
    if paths and not task.extra_test:
        able = ", ".join(name for name, t in tasks.TASKS.items() if t.extra_test)
        raise AblateError(
            f"data.extra_test: task {task.name!r} cannot score extra test files (tasks that can: "
            f"{able})"
        )
    found: dict[str, list] = {}
    for path in data.extra_test_paths(cfg.data):
        name = path.resolve().parent.name
        if name in found:
            raise AblateError(
                f"data.extra_test: two files in folders named {name!r}; their metrics "
                f"(test_{task.primary_metric}/{name}) would clash"
            )
        found[name] = task.read(path, lowercase=cfg.data.lowercase)
        labels.check_labels(found[name], task.labels, str(path))
    return found


def _check_scored(name: str, features: list, sentences: list, task: tasks.Task) -> None:
    # An invariant of the encoders, checked anyway: never report a score over part of a split.
    scored, gold = labels.count_scored(features), sum(len(s.words) for s in sentences)
    if scored != gold:
        raise AblateError(f"{name}: {scored} {task.item_name} encoded for scoring, gold has {gold}")


def _evaluate(trainer, task: tasks.Task, features: list) -> metrics.Evaluation:
    predictions, label_ids = trainer.predictions(features)  # dev: the last epoch's, if current
    return task.evaluate(np.asarray(predictions), np.asarray(label_ids), task.labels)


def torch_threads(cfg: DictConfig) -> int:
    """``trainer.threads``, else the cores divided among a parallel launcher's workers.

    joblib's workers start with OMP_NUM_THREADS=1, and each of N workers taking every core
    oversubscribes the machine; so each takes cores // N.
    """
    if cfg.trainer.threads:
        return cfg.trainer.threads
    cores = os.cpu_count() or 1
    workers = 1
    if HydraConfig.initialized():
        workers = OmegaConf.select(HydraConfig.get(), "launcher.n_jobs", default=None) or 1
        workers = cores if workers < 0 else workers  # joblib: -1 = one worker per core
    return max(1, cores // workers)


def fit(cfg: DictConfig, run: tracking.Run) -> dict[str, float]:
    """Train on train, evaluate dev every epoch and test (and ``data.extra_test``) at the end;
    log everything to ``run``. ``trainer.early_stopping_patience`` may end training early."""
    torch.set_num_threads(torch_threads(cfg))
    run.tags({"torch.threads": torch.get_num_threads()})
    set_seed(cfg.seed)
    task = tasks.get(cfg.data.task)
    model_lib.check_source(cfg.model)  # a missing model fails in seconds, before the data
    if not 0 <= cfg.trainer.warmup_ratio < 1:
        raise AblateError(f"trainer.warmup_ratio={cfg.trainer.warmup_ratio}: must be in [0, 1)")

    files = data.locate(cfg.data)
    run.tags({f"data.sha256.{s}": h for s, h in files.sha256.items()})
    run.tags({f"data.file.{s}": p for s, p in files.paths.items()})
    if cfg.data.version:
        run.tags({"data.version": cfg.data.version})
    sentences = {}
    for split, path in files.paths.items():
        sentences[split] = task.read(path, lowercase=cfg.data.lowercase)
        labels.check_labels(sentences[split], task.labels, str(path))
    if cfg.data.test_from_train is not None:  # before max_train_sentences: one test set for all
        seed = cfg.data.split_seed
        sentences["train"], sentences["test"] = data.hold_out(
            sentences["train"], cfg.data.test_from_train, seed, key=lambda s: s.words
        )
        held = f"{len(sentences['test'])} of {files.paths['train'].name}, data.split_seed={seed}"
        run.tags({"data.test": f"held out from train: {held}"})
    if cfg.data.max_train_sentences is not None:
        sentences["train"] = sentences["train"][: cfg.data.max_train_sentences]
    extra = read_extra_tests(cfg, task)

    tokenizer = model_lib.load_tokenizer(cfg.model)
    label2id = {name: i for i, name in enumerate(task.labels)}
    encode_stats = {split: {} for split in sentences}
    features = cache.encode_splits(cfg, task, sentences, tokenizer, label2id, run, encode_stats)
    run.metrics({f"{s}_{k}": v for s, counts in encode_stats.items() for k, v in counts.items()})
    for split, feats in features.items():
        _check_scored(split, feats, sentences[split], task)
    extra_features = {
        name: task.encode(sents, tokenizer, label2id, cfg.data.max_length)
        for name, sents in extra.items()
    }
    for name, feats in extra_features.items():
        _check_scored(f"data.extra_test {name}", feats, extra[name], task)
    counts = {f"{s}_sentences": len(sentences[s]) for s in sentences}
    run.metrics(counts)

    model = model_lib.build(cfg.model, task.model_class, task.labels)
    applied = freeze.apply(model, cfg.freeze)
    model = applied.model  # a strategy may wrap it (LoRA)
    run.metrics(
        {
            "trainable_params": applied.trainable_params,
            "total_params": applied.total_params,
            "trainable_pct": applied.trainable_pct,
        }
    )
    run.tags({"freeze.frozen_blocks": applied.frozen_blocks})
    log.info(
        "%s: %d / %d params trainable (%.1f %%), frozen blocks %s",
        cfg.freeze.name, applied.trainable_params, applied.total_params,
        applied.trainable_pct, applied.frozen_blocks,
    )  # fmt: skip

    # trainer.cache_frozen(_eval): blocks k.. run on the cached output of a frozen prefix, in
    # training and in dev evaluations after the first (ablate.prefix)
    model, features = prefix.wrap(cfg, applied, features, tokenizer, run)
    # trainer.embedding_rows: only the word-embedding rows the training data uses train
    rows_callbacks = embedding_rows.wrap(cfg, applied, model, features["train"], run)
    with _checkpoint_folder() as output_dir:
        epochs = tracking.EpochLogger(run, task.primary_metric, task.epoch_metrics)
        args = training_arguments(cfg, output_dir)
        collator = speed.CountingCollator(task.collator(tokenizer))
        trainer = speed.AblateTrainer(
            sorted_eval=cfg.trainer.sorted_eval,
            length_grouping=cfg.trainer.length_grouping,
            round_shapes=speed.round_shapes(cfg.trainer, args),  # bf16 on CPU: few batch shapes
            model=model,
            args=args,
            train_dataset=features["train"],
            eval_dataset=features["dev"],
            data_collator=collator,
            processing_class=tokenizer,
            compute_metrics=task.compute_metrics,
            preprocess_logits_for_metrics=metrics.argmax_logits,
            callbacks=[
                epochs,
                speed.SpeedMeter(run, collator, cfg.trainer.measure_flops),
                *(make(run) for make in applied.callbacks),
                *rows_callbacks,
            ],
        )
        # trainer.fast_dropout: CPU dropout masks from int32 draws (same distribution, faster)
        dropout.wrap(cfg, model, trainer.args.device, run, bool(trainer.args.bf16))
        if applied.param_groups is not None:  # the strategy's optimiser groups (llrd, gradual)
            trainer.optimizer = freeze.build_optimizer(trainer, applied.param_groups)
        if cfg.trainer.early_stopping_patience is not None:
            trainer.add_callback(EarlyStoppingCallback(cfg.trainer.early_stopping_patience))
        grouping = trainer.length_grouping
        if trainer.packing_unsupported:
            grouping += f" (pack: {trainer.packing_unsupported})"
        run.tags(
            {
                "ablate.checkpoint_dir": output_dir,
                "speed.length_grouping": grouping,
                "speed.round_shapes": trainer.rounding,
            }
        )
        train_out = trainer.train(resume_from_checkpoint=_resume_checkpoint(run))
    for folder, write in applied.artifacts.items():  # e.g. the LoRA adapter, not the whole model
        with tempfile.TemporaryDirectory() as tmp:
            write(tmp)
            run.artifacts(tmp, folder)

    best = max(epochs.history)
    results: dict[str, float] = {
        "train_runtime_s": train_out.metrics["train_runtime"],
        "train_samples_per_s": train_out.metrics["train_samples_per_second"],
        f"best_dev_{task.primary_metric}": best,
        "best_epoch": epochs.history.index(best) + 1,
        "stopped_epoch": round(trainer.state.epoch or 0),  # the last epoch trained
    }
    for split in ("dev", "test"):
        ev = _evaluate(trainer, task, features[split])
        results.update({f"{split}_{k}": v for k, v in ev.metrics.items()})
        for name, content in ev.artifacts.items():
            log_artifact = run.text if isinstance(content, str) else run.json
            log_artifact(content, f"reports/{split}_{name}")
        if split == "dev":  # ids per scored item: the report's paired bootstrap of Δ vs baseline
            run.json({"gold": ev.gold.tolist(), "pred": ev.pred.tolist()}, "predictions/dev.json")
    for name, feats in extra_features.items():  # zero-shot: the final model on other test sets
        ev = _evaluate(trainer, task, feats)
        results.update({f"test_{k}/{name}": v for k, v in ev.metrics.items()})
    results["peak_rss_mb"] = tracking.peak_rss_mb()
    # Metrics already logged are not logged again (a second point, at step 0): the per-epoch dev
    # metrics (the final model's are the last epoch's, or with early stopping the best epoch's:
    # best_dev_*) and counts equal to the split sizes (sst2's <split>_sentences).
    per_epoch = {f"dev_{m}" for m in (task.primary_metric, *task.epoch_metrics)}
    run.metrics({k: v for k, v in results.items() if k not in per_epoch and counts.get(k) != v})
    _remove_checkpoints(trainer.args.output_dir, run)
    return results


def last_complete_checkpoint(folder: str) -> str | None:
    """The newest ``checkpoint-N`` in ``folder`` that was completely written, or None.

    A process killed while saving leaves a partial folder; the Trainer rotates the previous
    checkpoint out only after a save completes, so the previous one is still there.
    """
    steps = sorted(Path(folder).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    for checkpoint in reversed(steps):
        # trainer_state.json is written last by the Trainer's save
        if (checkpoint / "trainer_state.json").is_file() and any(checkpoint.glob("*.safetensors")):
            return str(checkpoint)
    return None


def _resume_checkpoint(run: tracking.Run) -> str | None:
    """The last epoch checkpoint of the KILLED run this job continues, if any."""
    if run.resumed is None:
        return None
    folder = run.resumed.data.tags.get("ablate.checkpoint_dir", "")
    last = last_complete_checkpoint(folder)
    if last is None:
        raise AblateError(
            f"cannot resume run {run.resumed.info.run_id}: no epoch checkpoint in {folder!r} "
            f"(was it run with trainer.checkpoints=false, or killed in its first epoch?)"
        )
    log.info("resuming run %s from %s", run.resumed.info.run_id, last)
    return last


def _remove_checkpoints(output_dir: str, run: tracking.Run) -> None:
    # Checkpoints exist only to resume a killed run; a finished one needs none of them.
    folders = [output_dir]
    if run.resumed is not None:
        folders.append(run.resumed.data.tags.get("ablate.checkpoint_dir", ""))
    for folder in folders:
        for checkpoint in Path(folder).glob("checkpoint-*") if folder else ():
            shutil.rmtree(checkpoint, ignore_errors=True)
    with contextlib.suppress(OSError):  # the folder too, when nothing else is in it
        Path(output_dir).rmdir()
