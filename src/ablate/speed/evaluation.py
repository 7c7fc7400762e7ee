"""``trainer.sorted_eval``: dev/test sorted by length and cut into batches where padding plus a
per-batch cost is least (``batching.length_batches``), under ``torch.inference_mode()``; with
bf16 under ``no_grad`` in one autocast region for the whole evaluation, so each weight is cast
once. Predictions come back in the dataset's order: the same predictions (tested)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers.trainer_utils import EvalLoopOutput, has_length

from ablate.plugins import Context, Plugin
from ablate.speed import batching
from ablate.speed.precision import bf16_on_cpu


class SortedEvalMixin:
    """Trainer mixin: the core Trainer's evaluation pass over length-cut sorted batches."""

    sub_batch_cost = batching.SUB_BATCH_COST

    @property
    def eval_batch_cost(self) -> int:
        """What one more dev/test batch costs, in padded tokens (``length_batches``)."""
        cost = batching.sub_batch_cost(self.model)
        return cost * (batching.BF16_CPU_BATCH_COST if bf16_on_cpu(self.args) else 1)

    def prediction_step(self, *args, **kwargs):
        # bf16: no_grad, as autocast keeps no bf16 weight copies under inference mode
        grad = torch.no_grad() if self.args.bf16 else torch.inference_mode()
        with grad:
            return super().prediction_step(*args, **kwargs)

    def _weights_cast_once(self) -> contextlib.AbstractContextManager:
        # Under bf16 each forward enters autocast, and leaving it drops the bf16 copies of the
        # weights: every eval batch cast every weight again (casts were a quarter of bf16
        # evaluation on CPU). An enclosing autocast keeps those copies for the whole loop; no
        # step changes the weights during it, and every op casts as before.
        if not self.args.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.args.device.type, dtype=torch.bfloat16)

    def evaluation_pass(self, dataloader, description, *args, **kwargs) -> EvalLoopOutput:
        dataset = getattr(dataloader, "dataset", None)
        name = getattr(self.model, "main_input_name", "input_ids")
        with self._weights_cast_once():
            if (
                not has_length(dataset)
                or len(dataset) == 0
                or self.args.world_size > 1
                or self.args.batch_eval_metrics
                or not isinstance(dataset[0], Mapping)
                or name not in dataset[0]
            ):
                return super().evaluation_pass(dataloader, description, *args, **kwargs)
            batches = batching.length_batches(
                [len(dataset[i][name]) for i in range(len(dataset))],
                self.args.eval_batch_size,
                self.eval_batch_cost,
            )
            order = np.concatenate(batches)
            # The Trainer's loaders take one batch size; a DataLoader takes batches of any size.
            collate = self._get_collator_with_removed_columns(self.data_collator, description)
            loader = self.accelerator.prepare(
                DataLoader(
                    dataset,
                    batch_sampler=batches,
                    collate_fn=collate,
                    num_workers=self.args.dataloader_num_workers,
                    pin_memory=self.args.dataloader_pin_memory,
                )
            )
            out = super().evaluation_pass(loader, description, *args, **kwargs)
        return out._replace(
            predictions=batching.unsort(out.predictions, order),
            label_ids=batching.unsort(out.label_ids, order),
        )


class SortedEval(Plugin):
    name = "sorted_eval"
    switches = ("trainer.sorted_eval",)

    def prepare(self, ctx: Context) -> dict[str, str]:
        if not ctx.value("trainer.sorted_eval"):
            return {}
        ctx.mixins.append(SortedEvalMixin)
        return {}
