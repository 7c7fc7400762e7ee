"""The anatomy of an encoder with its task head, in any architecture: the blocks, the embeddings,
the pooler, the head's modules, parameter counts."""

from __future__ import annotations

from torch import nn

from ablate.errors import AblateError


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
    # peft keeps a frozen copy of every module it trains in full: ``original_module`` of a
    # module in ``modules_to_save`` (e.g. the classifier), ``base_layer`` of a LayerNorm under LN
    # tuning. The model in use holds the trained copy instead.
    shadows = [
        m.original_module
        for m in model.modules()
        if hasattr(m, "original_module") and hasattr(m, "modules_to_save")
    ]
    shadows += [m.base_layer for m in model.modules() if hasattr(m, "ln_tuning_layers")]
    return {id(p) for m in shadows for p in m.parameters()}


def count_params(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts of the model as used (adapters included)."""
    shadow = _shadow_params(model)
    params = [p for p in model.parameters() if id(p) not in shadow]
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


# The modules each kind of parameter-efficient method adapts by default, per architecture
# (``config.model_type``), named as ``freeze.target_modules`` names them (``target_names``):
# ``attention``: the query and value projections (LoRA and its kin); ``ia3``: key, value and the
# feed-forward output layer, whose input (the feed-forward activations) ``ia3_feedforward``
# rescales; ``norms``: every LayerNorm. Other architectures fall back to peft's own tables.
_BERT_LIKE = ("bert", "roberta", "xlm-roberta", "electra", "camembert")
TARGETS: dict[str, dict[str, list[str]]] = {
    "attention": {
        **dict.fromkeys(_BERT_LIKE, ["query", "value"]),
        "mpnet": ["q", "v"],
        "distilbert": ["q_lin", "v_lin"],
        "deberta-v2": ["query_proj", "value_proj"],
    },
    "ia3": {
        **dict.fromkeys(_BERT_LIKE, ["key", "value", "output.dense"]),
        "mpnet": ["k", "v", "output.dense"],
        "distilbert": ["k_lin", "v_lin", "ffn.lin2"],
        "deberta-v2": ["key_proj", "value_proj", "output.dense"],
    },
    "ia3_feedforward": {
        **dict.fromkeys((*_BERT_LIKE, "mpnet", "deberta-v2"), ["output.dense"]),
        "distilbert": ["ffn.lin2"],
    },
    "norms": {
        **dict.fromkeys((*_BERT_LIKE, "mpnet", "deberta-v2"), ["LayerNorm"]),
        "distilbert": ["LayerNorm", "sa_layer_norm", "output_layer_norm"],
    },
}


def target_names(model: nn.Module, kind: type[nn.Module]) -> dict[str, set[str]]:
    """The encoder's modules of type ``kind`` (the head's left out), by their name in the task
    model, each with the names a target may give it: the last part of its name (``query``) and,
    inside a transformer block, its path there (``attention.self.query``; ``output.dense`` is
    the feed-forward output, not ``attention.output.dense``)."""
    inner = unwrap(model)
    head = pooler(model)
    outside = {id(m) for m in head.modules()} if head is not None else set()
    inside = {id(m) for m in encoder(model).modules()} - outside
    in_block = {id(m): path for block in blocks(model) for path, m in block.named_modules() if path}
    return {
        name: {name.rsplit(".", 1)[-1], in_block.get(id(m), name.rsplit(".", 1)[-1])}
        for name, m in inner.named_modules()
        if isinstance(m, kind) and id(m) in inside
    }
