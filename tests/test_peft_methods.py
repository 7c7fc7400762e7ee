"""The peft methods (DoRA, AdaLoRA, LoHa, LoKr, VeRA, (IA)^3, LN tuning, beside LoRA): exact
trainable counts on MiniLM, their keys checked, a real run of each on POS, NER and SST-2, and the
kept adapter, which loads over the encoder and predicts what the run did."""

from __future__ import annotations

import pytest
import torch
from helpers.data import ROOT, UNPIN
from helpers.models import predicted
from helpers.runs import compose_cfg, fit_here, kept_minilm_run, slice_overrides, train
from helpers.store import logged
from mlflow.tracking import MlflowClient
from peft.tuners.lokr.layer import factorization
from transformers import DistilBertConfig

from ablate import strategies, tasks
from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.models.build import build
from ablate.strategies import peft_build, peft_methods
from ablate.tasks.pos import UPOS
from ablate.training import keep

pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)
METHODS = ("dora", "adalora", "loha", "lokr", "vera", "ia3", "ln_tuning")


def expected_trainable(option: str, cfg, c, labels: int) -> int:
    """Trainable parameters of a BERT token classifier under ``option``, from its config."""
    h, i, n, f = c.hidden_size, c.intermediate_size, c.num_hidden_layers, cfg.freeze
    qv = 2 * n  # adapted Linears: query and value of every block, each h x h
    head = h * labels + labels
    (small, large) = factorization(h)  # each side of an h x h weight: small x large
    # LoKr: a full small x small factor (x) a large x large one, low rank where r < large / 2
    lokr = small * small + (2 * large * f.r if f.r < large / 2 else large * large)
    adapters = {
        "lora": qv * 2 * f.r * h,
        "dora": qv * (2 * f.r * h + h),  # + a magnitude per output unit
        "adalora": qv * (2 * f.init_r * h + f.init_r),  # A, B and the singular values E
        "loha": qv * 4 * f.r * h,  # two pairs of rank-r factors
        "lokr": qv * lokr,
        "vera": qv * (h + f.r),  # the vectors b (output) and d (rank)
        "ia3": n * (h + h + i),  # key, value and the feed-forward activations
        "ln_tuning": (2 * n + 1) * 2 * h,  # two LayerNorms a block and the embeddings'
    }[option]
    return adapters + head


def apply(option: str, *overrides: str, model: str = "minilm", task: str = "pos"):
    cfg = compose_cfg(f"model={model}", f"freeze={option}", *overrides)
    t = tasks.get(task)
    return cfg, strategies.apply(build(cfg.model, t.model_class, t.labels), cfg.freeze)


@pytest.mark.parametrize("option", ["lora", *METHODS])
def test_minilm_trainable_counts_are_exact(option):
    cfg, applied = apply(option)
    c = anatomy.unwrap(applied.model).config
    plain = anatomy.count_params(build(cfg.model, tasks.get("pos").model_class, UPOS))[1]
    assert applied.trainable_params == expected_trainable(option, cfg, c, len(UPOS))
    trainable = sum(p.numel() for p in applied.model.parameters() if p.requires_grad)
    assert trainable == applied.trainable_params
    # the model as used: its own weights and what the method adds (not peft's frozen copies of
    # what trains whole: the head, LN tuning's norms); AdaLoRA adds a frozen rank counter each
    head = c.hidden_size * len(UPOS) + len(UPOS)
    added = {"ln_tuning": 0, "adalora": trainable - head + 2 * c.num_hidden_layers}
    assert applied.total_params == plain + added.get(option, trainable - head)
    assert applied.frozen_blocks == [] and applied.embeddings_frozen == (option != "ln_tuning")
    assert "adapter" in applied.artifacts


def test_ia3_rescales_the_feed_forward_input_and_not_the_attention_output():
    _, applied = apply("ia3", model="tiny")
    config = applied.model.peft_config["default"]
    short = {name.split("layer.")[1] for name in config.target_modules}
    assert {"0.attention.self.key", "0.attention.self.value", "0.output.dense"} <= short
    assert not any("attention.output" in name for name in config.target_modules)
    assert set(config.feedforward_modules) == {
        n for n in config.target_modules if n.endswith(".output.dense")
    }
    _, only_kv = apply("ia3", "freeze.target_modules=[key,value]", model="tiny")
    assert only_kv.model.peft_config["default"].feedforward_modules == set()


def test_default_targets_per_architecture():
    distil = DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=37, num_labels=len(UPOS))
    model = tasks.get("pos").model_class.from_config(distil)

    def in_block_0(option: str) -> list[str]:
        cfg = compose_cfg(f"freeze={option}").freeze
        found = peft_build.targets(model, cfg, peft_methods.METHODS[option])
        return sorted(n.split(".layer.0.")[1] for n in found if ".layer.0." in n)

    assert in_block_0("lora") == ["attention.q_lin", "attention.v_lin"]
    assert in_block_0("ia3") == ["attention.k_lin", "attention.v_lin", "ffn.lin2"]
    assert in_block_0("ln_tuning") == ["output_layer_norm", "sa_layer_norm"]
    assert "distilbert.embeddings.LayerNorm" in peft_build.targets(
        model, compose_cfg("freeze=ln_tuning").freeze, peft_methods.METHODS["ln_tuning"]
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["freeze=ia3", "freeze.r=4"],
            r"freeze\.r=4 has no effect with freeze\.strategy=ia3 \(its keys: target_modules, "
            r"feedforward_modules\)",
        ),
        (
            ["freeze=lora", "freeze.d_initial=0.5"],
            r"freeze\.d_initial=0\.5 has no effect .*strategy=lora \(its keys: r, alpha, dropout, "
            r"target_modules\)",
        ),
        (["freeze=vera", "freeze.init_r=4"], r"freeze\.init_r=4 has no effect .*strategy=vera"),
        (["freeze=loha", "freeze.dropout=0.2"], r"freeze\.dropout=0\.2 has no effect"),
        (["freeze=adalora", "freeze.init_r=4"], r"freeze\.init_r=4 < freeze\.r=8"),
        (["freeze=adalora", "freeze.tinit=0.5", "freeze.tfinal=0.5"], r"must be < 1"),
        (["freeze=adalora", "freeze.delta_t=0"], r"freeze\.delta_t=0: must be a positive"),
        (["freeze=vera", "freeze.r=0"], r"freeze\.r=0: must be a positive integer"),
        (["freeze=dora", "freeze.dropout=1.0"], r"freeze\.dropout=1\.0: must be in \[0, 1\)"),
        (
            ["freeze=ln_tuning", "freeze.target_modules=[query]"],
            r"freeze\.target_modules=\['query'\]: \['query'\]; allowed: the encoder's LayerNorm "
            r"layers .*: LayerNorm",
        ),
        (
            ["freeze=ia3", "freeze.target_modules=[key]", "freeze.feedforward_modules=[value]"],
            r"freeze\.feedforward_modules=\['value'\] must name targets",
        ),
    ],
)
def test_bad_settings_are_clear_errors(overrides, message):
    cfg = compose_cfg("model=tiny", *overrides)
    model = build(cfg.model, tasks.get("pos").model_class, UPOS)
    with pytest.raises(AblateError, match=message):
        strategies.apply(model, cfg.freeze)


# -- real runs ---------------------------------------------------------------------------------


def on_task(slice_root, task_root, store, task: str) -> list[str]:  # noqa: F811
    """Overrides for a one-epoch run of the tiny model on 40 sentences of ``task``'s slice, in
    this process."""
    if task == "pos":
        base = slice_overrides(slice_root, store, ROOT)
        data = [o for o in base if not o.startswith(("hydra.", "trainer.epochs"))]
    else:
        unpin = {"ner": ["data=conll2003", *UNPIN], "sst2": ["data=sst2", *UNPIN[:2]]}[task]
        data = [*unpin, f"data.root={task_root}", "model=tiny", f"tracking.uri={store}"]
    return [*data, "trainer.epochs=1", "data.max_train_sentences=40", "trainer.lr=5e-3"]


@pytest.mark.parametrize("task", ["pos", "ner", "sst2"])
def test_every_method_trains_on_every_task(slice_root, task_root, store, task):  # noqa: F811
    client = MlflowClient(store)
    for option in METHODS:
        cfg = compose_cfg(*on_task(slice_root, task_root, store, task), f"freeze={option}")
        run_id, results = fit_here(cfg)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED", option
        t = tasks.get(cfg.data.task)
        c = build(cfg.model, t.model_class, t.labels).config
        want = expected_trainable(option, cfg, c, len(t.labels))
        if task == "sst2":  # the sentence head: BERT's pooler trains with it
            want += c.hidden_size**2 + c.hidden_size
        assert run.data.metrics["trainable_params"] == want, option
        assert run.data.params["freeze.strategy"] == option
        files = {a.path for a in client.list_artifacts(run_id, "adapter")}
        assert "adapter/adapter_model.safetensors" in files, option
        assert 0.0 <= results[f"dev_{t.primary_metric}"] <= 1.0


def test_adalora_prunes_to_its_budget_over_the_run(slice_root, store, tmp_path):
    _, prepared = train(
        slice_root,
        store,
        tmp_path,
        "freeze=adalora",
        "freeze.tinit=0.2",
        "freeze.tfinal=0.3",
        "trainer.lr=5e-3",
    )
    model = prepared.applied.model
    config = model.peft_config["default"]
    steps = config.total_step  # the run's: 2 epochs of the slice
    assert steps > 10 and (config.tinit, config.tfinal) == (int(0.2 * steps), int(0.3 * steps))
    kept = [sum(mask) for mask in config.rank_pattern.values()]
    assert len(kept) == 2 * 6 and sum(kept) == 8 * len(kept)  # the target budget: r=8 each
    assert len(set(kept)) > 1  # spread unevenly over the matrices: the point of the method
    singular = [p for n, p in model.named_parameters() if "lora_E" in n]
    assert sum(int((p != 0).sum()) for p in singular) == sum(kept)  # the rest pruned


def perturbed(applied):
    """``applied``'s model with every trained weight moved off its initial value (DoRA's
    magnitudes, LoRA's B and (IA)^3's ones would otherwise merge or save as no change)."""
    with torch.no_grad():
        for p in applied.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    return applied.model.eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


@pytest.mark.parametrize("option", METHODS)
def test_a_kept_adapter_loads_over_the_encoder_with_its_trained_weights(
    tmp_path, tokenizer, option
):
    cfg, applied = apply(option)
    model = perturbed(applied)
    keep.save(cfg.model, tasks.get("pos"), model, tokenizer, tmp_path / "model")
    saved = {p.name for p in (tmp_path / "model" / "adapter").iterdir()}
    assert "adapter_model.safetensors" in saved and "model.safetensors" not in saved
    loaded = keep.load(str(tmp_path / "model")).model
    assert type(loaded).__name__ == "PeftModelForTokenClassification"
    ids = torch.randint(1000, 20000, (2, 11))
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids))


@pytest.mark.parametrize("option", METHODS)
@pytest.mark.parametrize("task", ["pos", "sst2"])
def test_a_random_encoder_is_kept_whole_with_the_method_merged_in(option, task):
    cfg, applied = apply(option, model="tiny", task=task)
    model = perturbed(applied)
    plain = keep.plain_copy(cfg.model, tasks.get(task), model)
    assert not any("lora" in n or "modules_to_save" in n for n in plain.state_dict())
    ids = torch.randint(1000, 20000, (2, 11))
    torch.testing.assert_close(logits(plain, ids), logits(model, ids))


def test_a_trained_adalora_adapter_is_kept_pruned_and_loads(
    slice_root, store, tmp_path, monkeypatch
):
    run_id, prepared = kept_minilm_run(
        slice_root, store, tmp_path, monkeypatch, "freeze=adalora", "trainer.lr=5e-3"
    )
    tagger = keep.load(f"runs:/{run_id}/model")
    config = tagger.model.peft_config["default"]
    assert sum(sum(mask) for mask in config.rank_pattern.values()) == 8 * 12  # pruned to r
    test = logged(store, run_id, tmp_path, "predictions/test.json")
    assert predicted(tagger.model, prepared, "test") == (test["gold"], test["pred"])
