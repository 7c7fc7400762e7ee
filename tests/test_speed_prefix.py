"""The frozen-prefix caches (``trainer.cache_frozen``, ``cache_frozen_eval``): the cached model
computes the full model's logits, trains like it without dropout, refuses where something below
the prefix trains, and its checkpoints are the plain model's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from helpers.runs import FakeRecorder
from helpers.speed import NO_DROPOUT, TASK, build, compose, make_trainer, tiny_distilbert
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

from ablate import strategies, tasks
from ablate.data.encode import IGNORE
from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.models.build import build as build_model
from ablate.plugins import Context
from ablate.speed import prefix
from ablate.speed.cache_frozen import CacheFrozen, StackIndices
from ablate.speed.precision import cpu_bf16


def wrap(cfg, applied, features, tokenizer):
    """What the cache_frozen plugin makes of a run: (model, features, status)."""
    ctx = Context(
        cfg, TASK, applied, applied.model, dict(features), tokenizer, FakeRecorder(), "cpu",
        TASK.collator(tokenizer),
    )  # fmt: skip
    status = CacheFrozen().prepare(ctx)
    return ctx.model, ctx.features, status


def collator(tokenizer):
    return StackIndices(DataCollatorForTokenClassification(tokenizer))


@pytest.mark.parametrize("arch", ["bert", "bert-bilstm", "distilbert"])
def test_cached_prefix_logits_match_the_full_model_in_eval_mode(arch, features, tokenizer):
    if arch == "distilbert":
        applied = tiny_distilbert()
    else:
        head = ["model.head=bilstm"] if arch == "bert-bilstm" else []
        applied, _ = build("freeze=first4", "freeze.embeddings=true", *head)
    k, why = prefix.frozen_prefix(applied)
    assert (k, why) == (4, None)
    train = features["train"]
    store = prefix.compute(applied.model, k, train, batch_size=7)
    wrapped = prefix.PrefixCached(applied.model, k, store).eval()
    rows = [{**train[i], "prefix_index": i} for i in (0, 5, 17, 33, 60)]  # various lengths
    batch = collator(tokenizer)(rows)
    with torch.no_grad():
        cached = wrapped(**batch).logits
        full = applied.model(**{k: v for k, v in batch.items() if k != "prefix_index"}).logits
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(cached[real], full[real], atol=1e-5, rtol=1e-5)
    assert prefix.check(wrapped, train) < 1e-5


def test_cached_prefix_training_equals_uncached_training_without_dropout(features, tokenizer):
    applied, _ = build("freeze=first4", "freeze.embeddings=true", *NO_DROPOUT)
    uncached = copy.deepcopy(applied.model)
    initial = applied.model.classifier.weight.detach().clone()
    train = features["train"]
    wrapped = prefix.PrefixCached(applied.model, 4, prefix.compute(applied.model, 4, train, 16))
    collate = collator(tokenizer)
    models = (wrapped, uncached)
    optimisers = [
        torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2) for m in models
    ]
    for start in range(0, 64, 16):
        batch = collate([{**train[i], "prefix_index": i} for i in range(start, start + 16)])
        plain_batch = {k: v for k, v in batch.items() if k != "prefix_index"}
        for model, opt, inputs in zip(models, optimisers, (batch, plain_batch), strict=True):
            model.train()
            model(**inputs).loss.backward()
            opt.step()
            opt.zero_grad()
    dev = collate(features["dev"][:8])
    with torch.no_grad():
        after = [m.eval()(**dev).logits for m in models]
    torch.testing.assert_close(after[0], after[1], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(applied.model.classifier.weight, initial)  # it did train


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["freeze=first4"], "embedding parameters train"),
        (["freeze=last2", "freeze.embeddings=true"], "block 0 trains"),
        (["freeze=gradual"], "changes what trains"),
        (["freeze=lora"], "adapter"),
        (["freeze=none"], "embedding parameters train"),
        (["freeze=bitfit"], "embedding parameters train (layer strategies"),
    ],
)
def test_frozen_prefix_is_refused_where_something_below_it_trains(overrides, why):
    applied, _ = build(*overrides)
    k, reason = prefix.frozen_prefix(applied)
    assert k == 0 and why in reason


def test_a_sentence_heads_pooler_does_not_stop_the_frozen_prefix():
    cfg = compose("freeze=first2", "freeze.embeddings=true")
    task = tasks.get("sst2")
    applied = strategies.apply(build_model(cfg.model, task.model_class, task.labels), cfg.freeze)
    pooler = anatomy.pooler(applied.model)  # in the encoder, trains with the head
    assert pooler is not None and all(p.requires_grad for p in pooler.parameters())
    assert prefix.frozen_prefix(applied) == (2, None)


def test_cache_frozen_off_or_invalid_leaves_the_model_alone(features, tokenizer):
    for overrides, tag in (
        (["freeze=first4", "freeze.embeddings=true", "trainer.cache_frozen_eval=false"], "off"),
        (["freeze=first4", "trainer.cache_frozen=true"], "not applied: embedding parameters train"),
    ):
        applied, cfg = build(*overrides)
        model, feats, status = wrap(cfg, applied, features, tokenizer)
        assert model is applied.model and feats == features
        assert status["cache_frozen"].startswith(tag)
        assert status["cache_frozen_eval"].startswith(tag)


def test_a_cached_forward_that_differs_is_refused_or_left_out(features, tokenizer, monkeypatch):
    real = prefix._prefix_output
    # an encoder whose blocks do not compose as prefix.py assumes: the cached output is off
    monkeypatch.setattr(prefix, "_prefix_output", lambda *a: real(*a) + 0.5)
    applied, cfg = build("freeze=first4", "freeze.embeddings=true")
    model, feats, status = wrap(cfg, applied, features, tokenizer)  # eval cache: on by default
    assert model is applied.model and feats == features  # evaluated the usual way
    assert status["cache_frozen_eval"].startswith("not applied: the cached forward")
    applied, cfg = build("freeze=first4", "freeze.embeddings=true", "trainer.cache_frozen=true")
    with pytest.raises(AblateError, match="trainer.cache_frozen: the cached forward .* differs"):
        wrap(cfg, applied, features, tokenizer)  # asked for: an error


def test_a_cached_forward_that_fails_leaves_dev_evaluation_the_usual_way(
    features, tokenizer, monkeypatch
):
    def fails(*args):
        raise RuntimeError("sequence length should be a multiple of 4")

    monkeypatch.setattr(prefix, "_prefix_output", fails)
    applied, cfg = build("freeze=first4", "freeze.embeddings=true")
    model, feats, status = wrap(cfg, applied, features, tokenizer)
    assert model is applied.model and feats == features
    assert status["cache_frozen_eval"] == (
        "not applied: RuntimeError: sequence length should be a multiple of 4"
    )


def test_dev_evaluations_after_the_first_reuse_the_frozen_prefix(features, tokenizer):
    applied, cfg = build("freeze=first4", "freeze.embeddings=true")  # cache_frozen_eval: default
    full = copy.deepcopy(applied.model).eval()  # the same weights, evaluated the usual way
    wrapped, feats, status = wrap(cfg, applied, features, tokenizer)
    assert status["cache_frozen"] == "off"  # training runs the full model
    assert status["cache_frozen_eval"].startswith("dev windows: embeddings + blocks 0-3")
    assert feats["train"] is features["train"] and wrapped.store is None
    assert [f["eval_index"] for f in feats["dev"]] == list(range(len(features["dev"])))
    prefix_calls = []
    block0 = anatomy.blocks(applied.model)[0]
    block0.register_forward_hook(lambda module, args, out: prefix_calls.append(1))
    collate = collator(tokenizer)
    batches = [collate(feats["dev"][i : i + 8]) for i in range(0, len(feats["dev"]), 8)]

    def evaluate():
        wrapped.eval()
        with torch.inference_mode():
            return [wrapped(**b).logits for b in batches]

    def expected():
        with torch.inference_mode():
            plain = [{k: v for k, v in b.items() if k != "eval_index"} for b in batches]
            return [full(**b).logits for b in plain]

    def assert_same(got, want):
        for g, w, b in zip(got, want, batches, strict=True):
            real = b["attention_mask"].bool()
            torch.testing.assert_close(g[real], w[real], atol=1e-5, rtol=1e-5)

    assert_same(evaluate(), expected())
    assert len(prefix_calls) == len(batches)  # the first evaluation ran the prefix once a batch
    assert bool(wrapped.eval_store.filled.all())
    # a training step changes blocks 4-5 and the head; the kept prefix output stays valid
    wrapped.train()
    opt = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=0.5)
    train_batch = collate(features["train"][:8])
    wrapped(**train_batch).loss.backward()
    opt.step()
    full.load_state_dict(applied.model.state_dict())
    prefix_calls.clear()
    assert_same(evaluate(), expected())
    assert prefix_calls == []  # no block below 4 ran in the second evaluation
    # training (no eval_index) and test windows (none either) run the full model
    wrapped.train()
    wrapped(**train_batch)
    assert prefix_calls == [1]


@pytest.mark.parametrize(
    ("sorted_eval", "bf16"),
    [
        (True, False),
        pytest.param(False, True, marks=pytest.mark.skipif(not cpu_bf16(), reason="no CPU bf16")),
    ],
)
def test_the_trainers_dev_evaluations_reuse_the_kept_prefix(
    tmp_path, features, tokenizer, sorted_eval, bf16
):
    overrides = (
        "freeze=first4", "freeze.embeddings=true", f"trainer.bf16={str(bf16).lower()}",
        f"trainer.sorted_eval={str(sorted_eval).lower()}",
    )  # fmt: skip
    applied, _ = build(*overrides)
    full = copy.deepcopy(applied.model)
    calls = []
    anatomy.blocks(applied.model)[0].register_forward_hook(lambda *args: calls.append(1))
    trainer = make_trainer(
        tmp_path / "cached", applied.model, features["train"], features["dev"], tokenizer,
        *overrides, "trainer.cache_frozen_eval=true",
    )  # fmt: skip
    assert isinstance(trainer.model, prefix.PrefixCached)
    dev = trainer.eval_dataset
    first = trainer.predict(dev)
    after_first = len(calls)
    second = trainer.predict(dev)
    assert after_first > 0 and len(calls) == after_first  # no block below 4 ran the second time
    plain = make_trainer(
        tmp_path / "full", full, features["train"], features["dev"], tokenizer, *overrides
    )
    expected = plain.predict(features["dev"])
    scored = expected.label_ids != IGNORE  # padded positions' logits come from other inputs
    for out in (first, second):
        np.testing.assert_array_equal(out.label_ids, expected.label_ids)
        np.testing.assert_array_equal(out.predictions[scored], expected.predictions[scored])
        assert out.metrics["test_accuracy"] == expected.metrics["test_accuracy"]


def test_checkpoints_of_a_prefix_cached_model_are_the_wrapped_models(tmp_path, features, tokenizer):
    cached_eval = ("freeze=first4", "freeze.embeddings=true", "trainer.cache_frozen_eval=true")

    def cached_trainer(folder):
        inner = build(*cached_eval)[0].model
        trainer = make_trainer(
            tmp_path / folder, inner, features["train"], features["dev"], tokenizer, *cached_eval
        )
        assert isinstance(trainer.model, prefix.PrefixCached)
        return inner, trainer

    inner, cached = cached_trainer("a")
    with torch.no_grad():
        inner.classifier.weight.add_(1.0)  # unlike a fresh build's
    trained = inner.classifier.weight.detach().clone()
    cached.create_optimizer_and_scheduler(num_training_steps=3)
    cached.state.global_step = 3  # what an epoch's end saves, and then tells the callbacks
    cached._save_checkpoint(cached.model, trial=None)
    cached.callback_handler.on_save(cached.args, cached.state, cached.control)
    checkpoint = tmp_path / "a" / "checkpoint-3"
    by_hand = AutoModelForTokenClassification.from_pretrained(checkpoint)
    assert torch.equal(by_hand.classifier.weight, trained)
    # resumed where the caches do not apply (trainer.cache_frozen_eval=false, older code) ...
    plain = build("freeze=first4", "freeze.embeddings=true")[0].model
    uncached = make_trainer(tmp_path / "b", plain, features["train"], features["dev"], tokenizer)
    assert not isinstance(uncached.model, prefix.PrefixCached)
    uncached._load_from_checkpoint(str(checkpoint))
    assert torch.equal(plain.classifier.weight, trained)
    # ... and the other way round
    uncached.save_model(str(tmp_path / "from-plain"))
    inner, cached = cached_trainer("c")
    cached._load_from_checkpoint(str(tmp_path / "from-plain"))
    assert torch.equal(inner.classifier.weight, trained)
