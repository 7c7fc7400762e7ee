"""Layer freezing: exact MiniLM trainable counts (from its config); blocks of any architecture."""

from __future__ import annotations

import pytest
from helpers.runs import compose_cfg
from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    DistilBertConfig,
    ElectraConfig,
    RobertaConfig,
    XLMRobertaConfig,
)

from ablate import strategies
from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.models.build import build as build_model
from ablate.tasks import TASKS
from ablate.tasks.pos import UPOS


@pytest.fixture(scope="module")
def minilm():
    cfg = compose_cfg("model=minilm")
    return build_model(cfg.model, TASKS["pos"].model_class, UPOS), cfg


def bert_sizes(c, num_labels: int) -> dict[str, int]:
    """Parameter counts of a BERT token classifier's parts, from its config alone."""
    h, i = c.hidden_size, c.intermediate_size
    block = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * (2 * h)  # QKV+out, FFN, 2 LayerNorms
    emb = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h
    head = h * num_labels + num_labels
    return {
        "block": block,
        "emb": emb,
        "head": head,
        "total": emb + c.num_hidden_layers * block + head,
    }


# option -> (frozen block indices for 6 blocks, embeddings frozen)
EXPECTED = {
    "none": ([], False),
    "all": ([0, 1, 2, 3, 4, 5], False),
    "first2": ([0, 1], False),
    "first4": ([0, 1, 2, 3], False),
    "alt": ([0, 2, 4], False),
    "alternating": ([0, 2, 4], False),
    "last2": ([4, 5], False),
}


@pytest.mark.parametrize("option", sorted(EXPECTED))
def test_minilm_trainable_counts_of_the_layer_options_are_exact(minilm, option):
    model, _ = minilm
    sizes = bert_sizes(model.config, len(UPOS))
    blocks, emb = EXPECTED[option]
    applied = strategies.apply(model, compose_cfg(f"freeze={option}").freeze)
    assert applied.total_params == sizes["total"]
    assert (
        applied.trainable_params
        == sizes["total"] - len(blocks) * sizes["block"] - emb * sizes["emb"]
    )
    assert applied.frozen_blocks == blocks
    assert all(p.requires_grad for p in model.classifier.parameters())


def test_freezing_the_embeddings_too(minilm):
    model, _ = minilm
    sizes = bert_sizes(model.config, len(UPOS))
    applied = strategies.apply(model, compose_cfg("freeze=all", "freeze.embeddings=true").freeze)
    assert applied.trainable_params == sizes["head"]  # only the classifier trains
    assert applied.embeddings_frozen
    assert 0.0 < applied.trainable_pct < 0.1


def test_selectors_combine_as_a_union(minilm):
    model, _ = minilm
    cfg = compose_cfg("freeze=first2", "freeze.layers=[5]", "freeze.last=1").freeze
    assert strategies.apply(model, cfg).frozen_blocks == [0, 1, 5]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("freeze.layers=[6]", r"block\(s\) \[6\] do not exist; the model has 6 blocks \(0\.\.5\)"),
        ("freeze.first=7", r"freeze\.first=7: must be between 0 and 6"),
        ("freeze.last=-1", r"freeze\.last=-1: must be between 0 and 6"),
    ],
)
def test_block_index_beyond_the_model_is_a_clear_error(minilm, override, message):
    model, _ = minilm
    with pytest.raises(AblateError, match=message):
        strategies.apply(model, compose_cfg(override).freeze)


TINY = dict(
    hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=37, vocab_size=99
)


@pytest.mark.parametrize(
    ("config", "path"),
    [
        (AutoConfig.for_model("bert", **TINY), "bert.encoder.layer"),
        (RobertaConfig(**TINY), "roberta.encoder.layer"),
        (XLMRobertaConfig(**TINY), "roberta.encoder.layer"),
        (ElectraConfig(embedding_size=16, **TINY), "electra.encoder.layer"),
        (
            DistilBertConfig(dim=32, n_layers=3, n_heads=2, hidden_dim=37, vocab_size=99),
            "distilbert.transformer.layer",
        ),
    ],
    ids=["bert", "roberta", "xlm-roberta", "electra", "distilbert"],
)
def test_blocks_and_embeddings_are_found_model_agnostically(config, path):
    config.num_labels = len(UPOS)
    model = AutoModelForTokenClassification.from_config(config)
    blocks = anatomy.blocks(model)
    assert blocks is model.get_submodule(path) and len(blocks) == 3
    cfg = compose_cfg("freeze=first2", "freeze.embeddings=true").freeze
    applied = strategies.apply(model, cfg)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    prefix = path.split(".")[0]
    assert any(n.startswith(f"{path}.0.") for n in frozen) and any(
        n.startswith(f"{path}.1.") for n in frozen
    )
    assert not any(n.startswith(f"{path}.2.") for n in frozen)
    assert any(n.startswith(f"{prefix}.embeddings.") for n in frozen)
    assert applied.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
