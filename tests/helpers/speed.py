"""Shared pieces of the speed tests: the tiny model on the Naija slice, and a run's Trainer built
the way ``ablate.training.fit`` builds it (through the speed plugins)."""

from __future__ import annotations

import torch
from transformers import AutoModelForTokenClassification, DistilBertConfig

from ablate import strategies, tasks
from ablate.models.build import build as build_model
from ablate.strategies.base import describe
from ablate.training.fit import build_trainer
from helpers.runs import FakeRecorder, compose_cfg

TASK = tasks.get("pos")
LABEL2ID = {name: i for i, name in enumerate(TASK.labels)}
NO_DROPOUT = (
    "+model.config_overrides.hidden_dropout_prob=0.0",
    "+model.config_overrides.attention_probs_dropout_prob=0.0",
)


def compose(*overrides: str):
    """The tiny model's config with ``overrides``."""
    return compose_cfg("model=tiny", *overrides)


def build(*overrides: str):
    """(the strategy applied to a fresh tiny model, its config); the same weights every call."""
    cfg = compose(*overrides)
    torch.manual_seed(0)
    model = build_model(cfg.model, AutoModelForTokenClassification, TASK.labels)
    return strategies.apply(model, cfg.freeze), cfg


def tiny_distilbert():
    """A tiny DistilBERT with blocks 0-3 and the embeddings frozen."""
    config = DistilBertConfig(
        vocab_size=30522, dim=32, n_layers=6, n_heads=2, hidden_dim=64, num_labels=len(LABEL2ID)
    )
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(config)
    return strategies.apply(model, compose("freeze=first4", "freeze.embeddings=true").freeze)


def make_trainer(tmp_path, model, train, dev, tokenizer, *overrides, recorder=None):
    """The Trainer a run of ``model`` gets from the speed plugins (``build_trainer``), with the
    prefix cache, embedding rows and fast dropout off unless ``overrides`` turn them on, so the
    given model trains as it is. ``trainer.speed_status`` holds what the plugins applied."""
    cfg = compose(
        "trainer.cache_frozen_eval=false", "trainer.embedding_rows=false",
        "trainer.fast_dropout=false", *overrides,
    )  # fmt: skip
    features = {"train": train, "dev": dev}
    record = recorder or FakeRecorder()
    trainer, status = build_trainer(
        cfg, TASK, describe(model), features, tokenizer, record, "cpu", str(tmp_path)
    )
    trainer.speed_status = status
    return trainer
