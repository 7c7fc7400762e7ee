"""The core Trainer: the stock Hugging Face Trainer plus the behaviour ablate's numbers rely on,
and the class a run trains with (the core one with the speed plugins' mixins in front)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import SequentialSampler
from transformers import Trainer
from transformers.trainer_utils import EvalLoopOutput, has_length

from ablate.data.encode import IGNORE


class CoreTrainer(Trainer):
    """The stock Trainer, plus:

    - the dev/test loss is the mean over scored labels (the Trainer averages batch means, each
      weighted as ``eval_batch_size`` examples, which a short last batch or batches of unequal
      size skew);
    - the training loop's last dev evaluation is kept, so the final dev metrics and predictions
      reuse it while the weights have not changed (``predictions``);
    - evaluation is sequential: predictions stay in dataset order (``predictions/dev.json``
      pairs items across runs), whatever the training sampler.

    ``evaluation_pass`` (one pass over a loader) is the hook speed mixins extend.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._keep_evaluation = False
        self._losses: torch.Tensor | None = None  # (sum of loss x scored labels, scored labels)
        self.last_evaluation: tuple[int, EvalLoopOutput] | None = None  # (global step, output)

    def _get_eval_sampler(self, eval_dataset):
        return SequentialSampler(eval_dataset) if has_length(eval_dataset) else None

    def prediction_step(self, *args, **kwargs):
        loss, logits, labels = super().prediction_step(*args, **kwargs)
        if loss is not None and torch.is_tensor(labels):
            # summed on the device in float64, batch after batch (as Python's floats summed
            # them), and read once per evaluation rather than once per batch
            scored = (labels != IGNORE).sum().double()
            pair = torch.stack([loss.detach().double() * scored, scored])
            self._losses = pair if self._losses is None else self._losses + pair
        return loss, logits, labels

    def evaluate(self, eval_dataset=None, *args, **kwargs):
        # Only the training loop's dev evaluation (no dataset given) is kept for predictions().
        self._keep_evaluation = eval_dataset is None
        try:
            return super().evaluate(eval_dataset, *args, **kwargs)
        finally:
            self._keep_evaluation = False

    def predictions(self, dataset) -> tuple[Any, Any]:
        """(predictions, label_ids) of ``dataset`` by the current model: the training loop's last
        dev evaluation when ``dataset`` is the dev set and the weights have not changed since
        (no step taken, no best checkpoint loaded), else a new ``predict``."""
        kept = self.last_evaluation
        if (
            kept is not None
            and dataset is self.eval_dataset
            and kept[0] == self.state.global_step
            and not self.args.load_best_model_at_end
        ):
            return kept[1].predictions, kept[1].label_ids
        out = self.predict(dataset)
        return out.predictions, out.label_ids

    def evaluation_loop(
        self,
        dataloader,
        description,
        prediction_loss_only=None,
        ignore_keys=None,
        metric_key_prefix="eval",
    ) -> EvalLoopOutput:
        self._losses = None
        out = self.evaluation_pass(
            dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
        )
        key = f"{metric_key_prefix}_loss"
        if key in out.metrics and self._losses is not None:
            total, scored = self._losses.tolist()
            if scored:
                out.metrics[key] = total / scored
        if self._keep_evaluation:
            self.last_evaluation = (self.state.global_step, out)
        return out

    def evaluation_pass(self, dataloader, *args, **kwargs) -> EvalLoopOutput:
        """One evaluation pass over ``dataloader`` (the stock loop); mixins may reorder it."""
        return super().evaluation_loop(dataloader, *args, **kwargs)


def trainer_class(mixins: list[type]) -> type[CoreTrainer]:
    """The core Trainer with ``mixins`` in front of it (the first one outermost); without any,
    ``CoreTrainer`` itself."""
    if not mixins:
        return CoreTrainer
    return type("AblateTrainer", (*mixins, CoreTrainer), {})
