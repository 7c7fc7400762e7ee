"""Loading the encoder (offline-safe) and building it with a fresh task head (``conf/model``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from omegaconf import OmegaConf
from torch import nn
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

from ablate.errors import AblateError
from ablate.models.heads import HEADS, BiLSTMTokenClassifier
from ablate.models.source import check_source
from ablate.quiet import quieted

if TYPE_CHECKING:
    from ablate.config import ModelConfig

log = logging.getLogger(__name__)


def _load(what: str, model: ModelConfig, fn, *args, **kwargs):
    check_source(model)
    path = model.name_or_path
    try:
        if what == "weights":  # safetensors only: never unpickle a downloaded weight file
            kwargs.setdefault("use_safetensors", True)
        return fn(path, *args, **kwargs)
    except (OSError, ValueError) as exc:
        raise AblateError(
            f"model.name_or_path={path!r}: could not load its {what}: neither a local "
            f"folder with one nor reachable on the Hugging Face hub (offline?): {exc}"
        ) from exc


def model_type(model: ModelConfig) -> str:
    """The architecture (``config.model_type``, e.g. ``bert``) of ``model.name_or_path``."""
    return _load("config", model, AutoConfig.from_pretrained).model_type


def load_tokenizer(model: ModelConfig):
    """The model's (fast) tokenizer."""
    return _load("tokenizer", model, AutoTokenizer.from_pretrained, use_fast=True)


def _no_load_report() -> contextlib.AbstractContextManager:
    # transformers prints a colour-coded table for every load; a fresh task head is expected
    # (and logged by _fresh_head in one line), so the table would only look like an error. Its
    # tensor-parallel check warns whenever the loader's logger is quieted, so both are; and the
    # weight-loading bar is for people at a terminal, not job logs.
    loggers = ("transformers.modeling_utils", "transformers.distributed.tensor_parallel")
    return quieted(dict.fromkeys(loggers, logging.ERROR), bars=("transformers",))


def _fresh_head(model: nn.Module, info: dict, path: str) -> None:
    """One log line for what the checkpoint did not hold: the fresh task head, as expected, or a
    warning naming encoder weights that were not in it."""
    base = getattr(model, "base_model_prefix", "")
    missing = list(info.get("missing_keys") or [])
    encoder = [k for k in missing if base and k.startswith(f"{base}.") and ".pooler." not in k]
    if encoder:
        log.warning(
            "%s: %d encoder weights were not in the checkpoint (randomly initialised): %s",
            path,
            len(encoder),
            ", ".join(encoder[:4]),
        )
    heads = sorted({k.split(".")[0] for k in missing if k not in encoder})
    unused = len(info.get("unexpected_keys") or [])
    log.info(
        "loaded %s; fresh task head: %s%s",
        path,
        ", ".join(heads) or "none",
        f"; {unused} checkpoint weights unused" if unused else "",
    )


def _head_dropout(config) -> float:
    for key in ("classifier_dropout", "hidden_dropout_prob", "dropout"):
        value = getattr(config, key, None)
        if value is not None:
            return float(value)
    return 0.1


def build(model: ModelConfig, model_class, label_names: Sequence[str]) -> nn.Module:
    """The encoder plus a fresh task head with ``len(label_names)`` outputs.

    ``model.pretrained=false`` builds random weights from the (overridden) config.
    ``model.head=bilstm`` puts a BiLSTM (``model.lstm_hidden`` units per direction; null = half
    the encoder's width) between the encoder and the classifier.
    """
    if model.head not in HEADS:
        raise AblateError(f"model.head={model.head!r} is not one of {', '.join(HEADS)}")
    if model.lstm_hidden is not None and model.head != "bilstm":
        raise AblateError(
            f"model.lstm_hidden={model.lstm_hidden} sizes the bilstm head, but model.head="
            f"{model.head!r}; set model.head=bilstm or leave model.lstm_hidden unset"
        )
    if model.head == "bilstm" and model_class is not AutoModelForTokenClassification:
        raise AblateError(
            f"model.head=bilstm labels every token; this task's model is {model_class.__name__}"
        )
    overrides = OmegaConf.to_container(model.config_overrides, resolve=True)
    config = _load(
        "config",
        model,
        AutoConfig.from_pretrained,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={name: i for i, name in enumerate(label_names)},
        **overrides,
    )
    if not model.pretrained:
        net = model_class.from_config(config)
    else:
        with _no_load_report():
            net, info = _load(
                "weights",
                model,
                model_class.from_pretrained,
                config=config,
                output_loading_info=True,
            )
        _fresh_head(net, info, model.name_or_path)
    if model.head == "linear":
        return net
    # The task model's own encoder: loaded the same way for every architecture, and without the
    # pooler that a bare AutoModel would add and never use.
    lstm_hidden = model.lstm_hidden if model.lstm_hidden is not None else config.hidden_size // 2
    if lstm_hidden < 1:
        raise AblateError(f"model.lstm_hidden={model.lstm_hidden}: must be a positive integer")
    return BiLSTMTokenClassifier(
        net.base_model, len(label_names), lstm_hidden, _head_dropout(config)
    )
