"""Building the encoder with its task head, and finding its blocks in any architecture."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf
from torch import nn
from transformers import AutoConfig, AutoTokenizer

from ablate.errors import AblateError


def _load(what: str, cfg: DictConfig, fn, *args, **kwargs):
    try:
        return fn(cfg.name_or_path, *args, **kwargs)
    except (OSError, ValueError) as exc:
        raise AblateError(
            f"model.name_or_path={cfg.name_or_path!r}: could not load its {what}: neither a local "
            f"folder with one nor reachable on the Hugging Face hub (offline?): {exc}"
        ) from exc


def load_tokenizer(cfg: DictConfig):
    """The model's (fast) tokenizer."""
    return _load("tokenizer", cfg, AutoTokenizer.from_pretrained, use_fast=True)


def build(cfg: DictConfig, model_class, label_names: Sequence[str]) -> nn.Module:
    """The encoder plus a fresh task head with ``len(label_names)`` outputs.

    ``model.pretrained=false`` builds random weights from the (overridden) config.
    """
    overrides = OmegaConf.to_container(cfg.config_overrides, resolve=True)
    config = _load(
        "config",
        cfg,
        AutoConfig.from_pretrained,
        num_labels=len(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={name: i for i, name in enumerate(label_names)},
        **overrides,
    )
    if not cfg.pretrained:
        return model_class.from_config(config)
    return _load("weights", cfg, model_class.from_pretrained, config=config)


def blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks, bottom to top.

    Known layouts first (BERT/RoBERTa/XLM-R/ELECTRA/DeBERTa: ``encoder.layer``; DistilBERT:
    ``transformer.layer``); otherwise the one ModuleList as long as ``config.num_hidden_layers``.
    """
    base = getattr(model, "base_model", model)
    for path in ("encoder.layer", "transformer.layer", "encoder.layers", "layers"):
        module = base
        for attr in path.split("."):
            module = getattr(module, attr, None)
        if isinstance(module, nn.ModuleList):
            return module
    n = getattr(model.config, "num_hidden_layers", None)
    candidates = [m for m in base.modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    if len(candidates) != 1:
        raise AblateError(
            f"cannot find the transformer blocks of {type(model).__name__}: "
            f"{len(candidates)} ModuleLists of length num_hidden_layers={n}"
        )
    return candidates[0]


def embeddings(model: nn.Module) -> nn.Module:
    """The embedding layer (token, position and type embeddings with their norm)."""
    base = getattr(model, "base_model", model)
    module = getattr(base, "embeddings", None)
    return module if isinstance(module, nn.Module) else model.get_input_embeddings()


def count_params(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
