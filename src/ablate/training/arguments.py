"""TrainingArguments of a run: the recipe (``conf/trainer``) plus what the speed plugins set."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from transformers import TrainingArguments

if TYPE_CHECKING:
    from ablate.config import TrainCore


def training_arguments(
    cfg: TrainCore, output_dir: str, device: str = "cpu", **speed: Any
) -> TrainingArguments:
    """TrainingArguments from ``trainer`` and ``seed``: dev evaluation and logging per epoch, one
    checkpoint per epoch kept until the run finishes; ``speed``: the plugins' fields."""
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
        use_cpu=device == "cpu",
        disable_tqdm=not sys.stderr.isatty(),  # progress bars only for people, not job logs
        **speed,
    )


def early_stopping_arguments(cfg: TrainCore) -> dict:
    """TrainingArguments for ``trainer.early_stopping_patience`` ({} when null): track the task's
    primary dev metric and load the best epoch's checkpoint when training ends.

    With ``save_total_limit=1`` the Trainer still keeps the best checkpoint besides the last.
    """
    from ablate import tasks

    if cfg.trainer.early_stopping_patience is None:
        return {}
    return {
        "load_best_model_at_end": True,
        "metric_for_best_model": f"eval_{tasks.get(cfg.data.task).primary_metric}",
        "greater_is_better": True,
    }
