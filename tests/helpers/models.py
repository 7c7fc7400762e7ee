"""Token classifiers as the package builds them, what each strategy should leave trainable on
MiniLM (counted from its config alone), and what a model predicts."""

from __future__ import annotations

import torch

from ablate.data.encode import IGNORE
from ablate.models.build import build as build_model
from ablate.tasks import TASKS
from ablate.tasks.pos import UPOS

NEW = ("lora", "bitfit", "llrd", "gradual", "embeddings")
C = len(UPOS)


def build(cfg):
    """The POS token classifier of ``cfg.model``, untouched by any strategy."""
    return build_model(cfg.model, TASKS["pos"].model_class, UPOS)


def bert_parts(c) -> dict[str, int]:
    """Parameter counts of a BERT token classifier's parts, from its config alone."""
    h, i, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    block = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * (2 * h)  # QKV+out, FFN, 2 LayerNorms
    emb = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h
    block_biases = 4 * h + i + h + 2 * h  # QKV+out, FFN in and out, 2 LayerNorm biases
    return {
        "block": block,
        "blocks": n * block,
        "emb": emb,
        "biases": n * block_biases + h,  # + the embeddings' LayerNorm bias
        "head": h * C + C,
    }


def expected_counts(option: str, cfg, c) -> tuple[int, int]:
    """(trainable, total) for MiniLM under ``option``, from the model and freeze configs."""
    p = bert_parts(c)
    total = p["emb"] + p["blocks"] + p["head"]
    f = cfg.freeze
    if option == "lora":
        adapters = c.num_hidden_layers * len(["query", "value"]) * f.r * 2 * c.hidden_size
        return adapters + p["head"], total + adapters
    trainable = {
        "none": total,
        "llrd": total,
        "all": p["emb"] + p["head"],
        "embeddings": p["blocks"] + p["head"],
        "bitfit": p["biases"] + p["head"],
        "gradual": p["head"],  # epoch 1: the head only
    }[option]
    return trainable, total


def predicted(model, prepared, split: str) -> tuple[list[int], list[int]]:
    """(gold, predicted) label ids of every scored word of ``split``, from ``model`` itself."""
    features = prepared.encoded.features[split]
    collate = prepared.task.collator(prepared.tokenizer)
    gold, pred = [], []
    with torch.no_grad():
        for start in range(0, len(features), 32):
            batch = collate(features[start : start + 32])
            labels = batch.pop("labels")
            logits = model(**batch).logits
            mask = labels != IGNORE
            gold += labels[mask].tolist()
            pred += logits.argmax(-1)[mask].tolist()
    return gold, pred
