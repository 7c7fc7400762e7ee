"""The core Trainer's evaluation: the dev loss is the mean over scored labels, summed on the
device and read back once per evaluation (no per-batch read of ablate's own)."""

from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F
from helpers.speed import NO_DROPOUT, build, make_trainer
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DataCollatorForTokenClassification

from ablate.data.encode import IGNORE


class HostReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` (a tensor's value read by the host) by the caller
    outside torch that asked for it: ablate's own, or the libraries' (the stock evaluation loop's
    padding check, transformers' mask check)."""

    def __init__(self):
        super().__init__()
        self.by_ablate = 0
        self.others = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            outside = (f.filename for f in reversed(traceback.extract_stack()))
            caller = next(f for f in outside if f != __file__ and "/torch/" not in f)
            if "/ablate/" in caller:
                self.by_ablate += 1
            else:
                self.others += 1
        return func(*args, **(kwargs or {}))


def test_the_dev_loss_is_the_mean_over_scored_labels_read_once(tmp_path, features, tokenizer):
    applied, _ = build(*NO_DROPOUT)
    dev = features["dev"][:11]
    reads, losses = {}, {}
    for batch in (2, 6):  # 6 batches, one short; 2 batches, one short
        trainer = make_trainer(
            tmp_path / str(batch), applied.model, features["train"][:4], dev, tokenizer,
            f"trainer.eval_batch_size={batch}", "trainer.sorted_eval=false",
        )  # fmt: skip
        with HostReads() as mode:
            losses[batch] = trainer.evaluate()["eval_loss"]
        reads[batch] = mode.by_ablate
        assert mode.others > 0  # the mode sees the reads it should
    assert reads == {2: 0, 6: 0}  # ablate's loss sums stay on the device (read by tolist)
    padded = DataCollatorForTokenClassification(tokenizer)(dev)
    labels = padded.pop("labels")
    with torch.no_grad():
        logits = applied.model.eval()(**padded).logits
    want = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    assert (labels != IGNORE).sum() > len(dev)
    for loss in losses.values():
        assert abs(loss - float(want)) < 1e-5
