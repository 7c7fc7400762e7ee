"""Building the encoder with its task head, and finding its blocks in any architecture."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer
from transformers.modeling_outputs import TokenClassifierOutput

from ablate import data
from ablate.errors import AblateError
from ablate.labels import IGNORE

HEADS = ("linear", "bilstm")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers within ``timeout`` seconds.

    Offline, transformers retries a hub id for ~46 s before failing; this probe (run in a thread,
    since a DNS lookup ignores socket timeouts) lets a bad id fail in seconds instead.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(ok)


def check_source(cfg: DictConfig) -> None:
    """Fail in seconds, before any data is read, if the model can't be had."""
    path = cfg.name_or_path
    looks_local = path.startswith((".", "/", "~")) or os.path.exists(path)
    if looks_local and not os.path.isdir(os.path.expanduser(path)):
        raise AblateError(f"model.name_or_path={path!r}: no such folder")
    if not looks_local and not hub_reachable():
        raise AblateError(
            f"model.name_or_path={path!r} is a hub id, and the Hugging Face hub is not reachable "
            f"(offline?): download the model elsewhere and pass its folder, or use model=minilm"
        )


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".h5", ".msgpack", ".onnx")


def source_fingerprint(cfg: DictConfig) -> str:
    """What ``model.name_or_path`` holds, not where: for a local folder, the sha256 of its files
    (weights only when ``model.pretrained``: a random init reads only the config); a hub id as
    given. The same model in another checkout (its own venv path) gives the same fingerprint."""
    folder = Path(cfg.name_or_path).expanduser()
    if not folder.is_dir():
        return str(cfg.name_or_path)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and ".git" not in p.parts)
    digest = hashlib.sha256()
    for f in files:
        if cfg.pretrained or f.suffix not in WEIGHT_FILES:
            digest.update(f"{f.relative_to(folder).as_posix()}\n{data.sha256_of(f)}\n".encode())
    return digest.hexdigest()


def _load(what: str, cfg: DictConfig, fn, *args, **kwargs):
    check_source(cfg)
    path = cfg.name_or_path
    try:
        if what == "weights":  # safetensors only: never unpickle a downloaded weight file
            kwargs.setdefault("use_safetensors", True)
        return fn(path, *args, **kwargs)
    except (OSError, ValueError) as exc:
        raise AblateError(
            f"model.name_or_path={cfg.name_or_path!r}: could not load its {what}: neither a local "
            f"folder with one nor reachable on the Hugging Face hub (offline?): {exc}"
        ) from exc


def model_type(cfg: DictConfig) -> str:
    """The architecture (``config.model_type``, e.g. ``bert``) of ``model.name_or_path``."""
    return _load("config", cfg, AutoConfig.from_pretrained).model_type


def load_tokenizer(cfg: DictConfig):
    """The model's (fast) tokenizer."""
    return _load("tokenizer", cfg, AutoTokenizer.from_pretrained, use_fast=True)


class BiLSTMTokenClassifier(nn.Module):
    """Encoder -> dropout -> BiLSTM -> dropout -> linear classifier, one label per sub-word.

    The contract of ``AutoModelForTokenClassification``: ``forward(input_ids, attention_mask,
    labels=None)`` returns a ``TokenClassifierOutput`` whose ``loss`` (cross-entropy over the
    positions whose label is not -100) is set when labels are given. Padding must be on the right
    (the tokenizers of BERT-family encoders pad there): the LSTM reads only the real sub-words.
    """

    # The loss is a mean over the batch's labelled positions; the Trainer must not pass
    # ``num_items_in_batch`` expecting a sum.
    accepts_loss_kwargs = False
    main_input_name = "input_ids"

    def __init__(self, encoder: nn.Module, num_labels: int, lstm_hidden: int, dropout: float):
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config  # the Trainer and peft read it
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(
            encoder.config.hidden_size, lstm_hidden, batch_first=True, bidirectional=True
        )
        self.classifier = nn.Linear(2 * lstm_hidden, num_labels)

    @property
    def base_model(self) -> nn.Module:
        """The encoder, as ``base_model`` is for Hugging Face task models."""
        return self.encoder

    def get_input_embeddings(self) -> nn.Module:
        return self.encoder.get_input_embeddings()

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        # Callers (the Trainer, peft) pass flags such as return_dict; only inputs go on.
        extra = {
            k: v
            for k, v in kwargs.items()
            if k in ("token_type_ids", "position_ids", "inputs_embeds") and v is not None
        }
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra)[0]
        hidden = self.dropout(hidden)
        if attention_mask is None:
            out, _ = self.lstm(hidden)
        else:
            lengths = attention_mask.sum(dim=1).clamp(min=1).cpu()
            packed = pack_padded_sequence(hidden, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.lstm(packed)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=hidden.size(1))
        logits = self.classifier(self.dropout(out))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE
            )
        return TokenClassifierOutput(loss=loss, logits=logits)


def _head_dropout(config) -> float:
    for key in ("classifier_dropout", "hidden_dropout_prob", "dropout"):
        value = getattr(config, key, None)
        if value is not None:
            return float(value)
    return 0.1


def build(cfg: DictConfig, model_class, label_names: Sequence[str]) -> nn.Module:
    """The encoder plus a fresh task head with ``len(label_names)`` outputs.

    ``model.pretrained=false`` builds random weights from the (overridden) config.
    ``model.head=bilstm`` puts a BiLSTM (``model.lstm_hidden`` units per direction; null = half
    the encoder's width) between the encoder and the classifier.
    """
    if cfg.head not in HEADS:
        raise AblateError(f"model.head={cfg.head!r} is not one of {', '.join(HEADS)}")
    if cfg.lstm_hidden is not None and cfg.head != "bilstm":
        raise AblateError(
            f"model.lstm_hidden={cfg.lstm_hidden} sizes the bilstm head, but model.head="
            f"{cfg.head!r}; set model.head=bilstm or leave model.lstm_hidden unset"
        )
    if cfg.head == "bilstm" and model_class is not AutoModelForTokenClassification:
        raise AblateError(
            f"model.head=bilstm labels every token; this task's model is {model_class.__name__}"
        )
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
        model = model_class.from_config(config)
    else:
        model = _load("weights", cfg, model_class.from_pretrained, config=config)
    if cfg.head == "linear":
        return model
    # The task model's own encoder: loaded the same way for every architecture, and without the
    # pooler that a bare AutoModel would add and never use.
    lstm_hidden = cfg.lstm_hidden if cfg.lstm_hidden is not None else config.hidden_size // 2
    if lstm_hidden < 1:
        raise AblateError(f"model.lstm_hidden={cfg.lstm_hidden}: must be a positive integer")
    return BiLSTMTokenClassifier(
        model.base_model, len(label_names), lstm_hidden, _head_dropout(config)
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The task model under an adapter wrapper (peft's ``PeftModel``), else ``model`` itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def owner(root: nn.Module, target: nn.Module) -> tuple[nn.Module, str]:
    """The module of ``root`` that holds ``target`` as a child, and the child's name."""
    for module in root.modules():
        for name, child in module.named_children():
            if child is target:
                return module, name
    raise AblateError(f"cannot find where {type(target).__name__} sits in {type(root).__name__}")


def encoder(model: nn.Module) -> nn.Module:
    """The transformer under the task head (``base_model`` of a Hugging Face task model)."""
    inner = unwrap(model)
    return getattr(inner, "base_model", inner)


def blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks, bottom to top.

    Known layouts first (BERT/RoBERTa/XLM-R/ELECTRA/DeBERTa: ``encoder.layer``; DistilBERT:
    ``transformer.layer``); otherwise the one ModuleList as long as ``config.num_hidden_layers``.
    """
    base = encoder(model)
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
    module = getattr(encoder(model), "embeddings", None)
    return module if isinstance(module, nn.Module) else unwrap(model).get_input_embeddings()


def pooler(model: nn.Module) -> nn.Module | None:
    """The encoder's pooler, when it has one (BERT's sequence classification), else None.

    Only the sentence head reads it, so it is part of the head: strategies train it whenever
    they train the head, as DistilBERT's ``pre_classifier`` and RoBERTa's classification head,
    which sit outside the encoder.
    """
    module = getattr(encoder(model), "pooler", None)
    if isinstance(module, nn.Module) and any(True for _ in module.parameters()):
        return module
    return None


def head_modules(model: nn.Module) -> list[str]:
    """Names of the head's modules: the task model's top-level modules with parameters outside
    the encoder, and the encoder's ``pooler`` if it has one."""
    inner = unwrap(model)
    base = encoder(model)
    names = [
        name
        for name, child in inner.named_children()
        if child is not base and any(True for _ in child.parameters())
    ]
    return names + (["pooler"] if pooler(model) is not None else [])


def _shadow_params(model: nn.Module) -> set[int]:
    # peft keeps a frozen copy of every module it trains in full (``modules_to_save``, e.g. the
    # classifier) as ``original_module``; the model in use holds the trained copy instead.
    return {
        id(p)
        for m in model.modules()
        if hasattr(m, "original_module") and hasattr(m, "modules_to_save")
        for p in m.original_module.parameters()
    }


def count_params(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of the model as used (adapters included)."""
    shadow = _shadow_params(model)
    params = [p for p in model.parameters() if id(p) not in shadow]
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
