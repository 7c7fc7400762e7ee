"""Strategies beyond layer freezing (LoRA, BitFit, LLRD, gradual unfreezing, embeddings) and the
BiLSTM head: exact MiniLM counts, LoRA's targets, the errors of bad settings. Their real runs:
tests/test_strategy_runs.py."""

from __future__ import annotations

import pytest
from helpers.models import NEW, C, bert_parts, build, expected_counts
from helpers.runs import compose_cfg
from transformers import DistilBertConfig

from ablate import config, freeze_keys, report, strategies
from ablate.errors import AblateError
from ablate.freeze_keys import Key
from ablate.models import anatomy
from ablate.models.build import build as build_model
from ablate.strategies import peft_build, peft_methods
from ablate.tasks import TASKS


@pytest.fixture(scope="module")
def minilm():
    return build(compose_cfg())


@pytest.mark.parametrize("option", ["none", "all", *NEW])
def test_minilm_trainable_counts_of_each_strategy_family_are_exact(minilm, option):
    cfg = compose_cfg(f"freeze={option}")
    model = build(cfg) if option == "lora" else minilm  # LoRA modifies the model it wraps
    applied = strategies.apply(model, cfg.freeze)
    expected = expected_counts(option, cfg, model.config)
    assert (applied.trainable_params, applied.total_params) == expected
    trainable = sum(p.numel() for p in applied.model.parameters() if p.requires_grad)
    assert trainable == applied.trainable_params


def test_minilm_counts_are_ordered_bitfit_lora_all_none(minilm):
    counts = {}
    for option in ("bitfit", "lora", "all", "none"):
        cfg = compose_cfg(f"freeze={option}")
        counts[option] = expected_counts(option, cfg, minilm.config)[0]
    assert counts["bitfit"] < counts["lora"] < counts["all"] < counts["none"]


@pytest.mark.parametrize("option", ["head_only", "bitfit", "gradual", "lora"])
def test_bert_pooler_trains_with_the_sentence_head(option):
    # DistilBERT's pre_classifier sits outside the encoder and trains with the head; BERT's
    # pooler, the same layer, sits inside it.
    cfg = compose_cfg("model=tiny", f"freeze={option}")
    task = TASKS["sst2"]
    applied = strategies.apply(build_model(cfg.model, task.model_class, task.labels), cfg.freeze)
    h, n = applied.model.config.hidden_size, len(task.labels)

    def trainable() -> dict[str, int]:  # under LoRA the trained copy (peft keeps a frozen one)
        inner = anatomy.unwrap(applied.model)
        return {
            name: sum(p.numel() for p in module.parameters() if p.requires_grad)
            for name, module in (("pooler", anatomy.pooler(inner)), ("head", inner.classifier))
        }

    assert trainable() == {"pooler": h * h + h, "head": h * n + n}
    if option == "lora":
        assert "pooler" in applied.model.peft_config["default"].modules_to_save  # saved with it
    if option == "gradual":  # every stage of the schedule
        unfreezing = applied.callbacks[0].__self__
        for epoch in range(len(unfreezing.schedule)):
            unfreezing.set_epoch(epoch)
            assert trainable() == {"pooler": h * h + h, "head": h * n + n}


def test_bilstm_head_on_a_frozen_minilm_counts():
    cfg = compose_cfg("freeze=all", "model.head=bilstm")
    model = build(cfg)
    applied = strategies.apply(model, cfg.freeze)
    c, p = model.config, bert_parts(model.config)
    h = c.hidden_size // 2  # model.lstm_hidden: null = half the encoder's width
    lstm = 2 * 4 * (h * c.hidden_size + h * h + 2 * h)  # 2 directions x 4 gates, 2 bias vectors
    head = lstm + 2 * h * C + C
    assert applied.trainable_params == p["emb"] + head
    assert applied.total_params == p["emb"] + p["blocks"] + head
    assert applied.frozen_blocks == list(range(c.num_hidden_layers))


def test_lora_targets_default_per_architecture_and_are_checked(minilm):
    lora = peft_methods.METHODS["lora"]
    found = peft_build.targets(minilm, compose_cfg("freeze=lora").freeze, lora)
    assert len(found) == 2 * 6 and {n.rsplit(".", 1)[1] for n in found} == {"query", "value"}
    distil = DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=37, num_labels=C)
    distil_model = TASKS["pos"].model_class.from_config(distil)
    found = peft_build.targets(distil_model, compose_cfg("freeze=lora").freeze, lora)
    assert len(found) == 2 * 2 and {n.rsplit(".", 1)[1] for n in found} == {"q_lin", "v_lin"}
    cfg = compose_cfg("freeze=lora", "freeze.target_modules=[query,qkv]").freeze
    with pytest.raises(AblateError, match=r"freeze\.target_modules=.*\['qkv'\].*query, value"):
        peft_build.targets(minilm, cfg, lora)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["freeze=llrd", "freeze.decay=0"], r"freeze\.decay=0\.0: must be in \(0, 1\]"),
        (["freeze=llrd", "freeze.decay=1.5"], r"freeze\.decay=1\.5: must be in \(0, 1\]"),
        (["freeze=gradual", "freeze.schedule=[2,1]"], r"freeze\.schedule=\[2, 1\]: .*0 and 7"),
        (["freeze=gradual", "freeze.schedule=[9]"], r"freeze\.schedule=\[9\]"),
        (["freeze=lora", "freeze.r=0"], r"freeze\.r=0"),
        (["freeze=lora", "freeze.first=2"], r"freeze\.first=2 has no effect .*strategy=lora"),
        (["freeze=bitfit", "freeze.decay=0.5"], r"freeze\.decay=0\.5 has no effect"),
        (["freeze=none", "freeze.strategy=magic"], r"freeze\.strategy='magic' is not one of"),
    ],
)
def test_bad_strategy_settings_are_clear_errors(minilm, overrides, message):
    with pytest.raises(AblateError, match=message):
        strategies.apply(minilm, compose_cfg(*overrides).freeze)


def test_unknown_head_is_a_clear_error():
    with pytest.raises(AblateError, match=r"model\.head='crf' is not one of linear, bilstm"):
        build(compose_cfg("model=tiny", "model.head=crf"))
    with pytest.raises(AblateError, match=r"model\.lstm_hidden=5 sizes the bilstm head, but "):
        build(compose_cfg("model=tiny", "model.lstm_hidden=5"))  # ignored by the linear head


def test_each_key_is_declared_once_and_its_doc_names_the_strategies_that_read_it():
    keys = dict(config.schema_keys())
    assert keys["freeze.r"].metadata["doc"] == (
        "vera, lora, dora, adalora, loha, lokr: rank (adalora: the average rank it ends at)"
    )
    assert keys["freeze.decay"].metadata["doc"].startswith("llrd: lr x decay")
    assert keys["freeze.first"].metadata["doc"].startswith("layers, llrd: ")
    assert keys["freeze.init_r"].metadata["added"] and not keys["freeze.r"].metadata["added"]
    for name, readers in freeze_keys.READERS.items():
        assert f"freeze.{name}" in keys
        assert all(name in strategies.STRATEGIES[r].keys for r in readers)
    # another declaration of a declared key, or a name nothing declared, is refused whole
    twice = strategies.Strategy("rank4", "x:y", (Key("n", int, 1, "new"), Key("r", int, 4, "r")))
    with pytest.raises(AblateError, match=r"freeze\.r: declared twice"):
        strategies.register(twice)
    with pytest.raises(AblateError, match=r"freeze\.rank is not declared"):
        strategies.register(strategies.Strategy("rank", "x:y", ("rank",)))
    assert "n" not in freeze_keys.KEYS and "rank4" not in strategies.STRATEGIES


def test_the_report_order_is_the_order_the_strategies_declare():
    # full fine-tuning, least to most frozen, bitfit, the peft methods, llrd and gradual
    today = "none embeddings first2 first4 alt last2 all features head_only bitfit ln_tuning ia3 "
    today += "vera lora lora_qkv dora adalora loha lokr llrd gradual"
    assert tuple(today.split()) == report.STRATEGY_ORDER
    ordered = report.strategy_order(["zeta", "lora", "none", "alpha"])
    assert ordered == ["none", "lora", "alpha", "zeta"]
