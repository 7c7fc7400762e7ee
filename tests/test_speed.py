"""Speed work (issue 6): tokenisation cache, length grouping, sorted evaluation, frozen-prefix
caching, precision settings, the bench's table, and a real sweep with the caches on."""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import logged_runs, run_cli, slice_overrides
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from transformers import (
    AutoModelForTokenClassification,
    DataCollatorForTokenClassification,
    DistilBertConfig,
)

from ablate import (
    bench,
    cache,
    dropout,
    embedding_rows,
    freeze,
    labels,
    metrics,
    prefix,
    speed,
    tasks,
)
from ablate import model as model_lib
from ablate.errors import AblateError
from ablate.labels import IGNORE
from ablate.trainer import training_arguments

TASK = tasks.get("pos")
LABEL2ID = {name: i for i, name in enumerate(TASK.labels)}


class FakeRun:
    """Collects what a tracking.Run would log."""

    def __init__(self):
        self.tag_log: dict[str, str] = {}
        self.metric_log: dict[str, float] = {}

    def tags(self, tags):
        self.tag_log.update({k: str(v) for k, v in tags.items()})

    def metrics(self, values, step=None):
        self.metric_log.update(values)


def compose(*overrides: str):
    return bench.compose(["model=tiny", *overrides])


@pytest.fixture(scope="module")
def tokenizer():
    return model_lib.load_tokenizer(compose().model)


@pytest.fixture(scope="module")
def sentences(slice_root):
    folder = slice_root / "ud" / "UD_Naija-Slice"
    return {
        s: TASK.read(next(folder.glob(f"*-ud-{s}.conllu")), lowercase=True)
        for s in ("train", "dev")
    }


@pytest.fixture(scope="module")
def features(sentences, tokenizer):
    return {s: TASK.encode(sents, tokenizer, LABEL2ID, 128) for s, sents in sentences.items()}


def build(*overrides: str):
    cfg = compose(*overrides)
    torch.manual_seed(0)
    model = model_lib.build(cfg.model, AutoModelForTokenClassification, TASK.labels)
    return freeze.apply(model, cfg.freeze), cfg


# --- tokenisation cache -------------------------------------------------------------------------


def test_tokenisation_cache_hits_on_the_second_job_and_is_invalidated(
    tmp_path, sentences, monkeypatch
):
    def job(max_length=128, tok=None, on=True):
        cfg = OmegaConf.create(
            {
                "data": {
                    "max_length": max_length,
                    "tokenized_cache": on,
                    "tokenized_cache_dir": str(tmp_path),
                }
            }
        )
        run, stats = FakeRun(), {s: {} for s in sentences}
        tok = tok or model_lib.load_tokenizer(compose().model)  # a fresh one, as in a new job
        feats = cache.encode_splits(cfg, TASK, sentences, tok, LABEL2ID, run, stats)
        return run.tag_log["data.cache"], feats, stats

    first, feats, stats = job()
    second, cached, cached_stats = job()
    assert (first, second) == ("miss", "hit")
    assert cached == feats and cached_stats == stats
    assert job(max_length=24)[0] == "miss"  # another window size
    assert job(max_length=24)[0] == "hit"
    other = model_lib.load_tokenizer(compose().model)
    other.add_tokens(["naijaword"])  # another vocabulary
    assert job(tok=other)[0] == "miss"
    left = model_lib.load_tokenizer(compose().model)
    left.truncation_side = "left"  # cuts over-long words from the other end
    assert job(tok=left)[0] == "miss"
    assert job()[0] == "hit"
    installed = importlib.metadata.version
    with monkeypatch.context() as m:  # another transformers release may tokenise differently
        m.setattr(
            importlib.metadata, "version", lambda p: "99.0" if p == "transformers" else installed(p)
        )
        assert job()[0] == "miss"
    assert job()[0] == "hit"
    assert job(on=False)[0] == "off"
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary files left
    for damage in (lambda b: b[:200], lambda b: b""):  # truncated, emptied: rebuilt, not a crash
        for path in tmp_path.glob("*.npz"):
            path.write_bytes(damage(path.read_bytes()))
        state, rebuilt, _ = job()
        assert state == "miss" and rebuilt == feats
        assert job()[0] == "hit"


def test_cache_files_hold_no_pickles_and_round_trip(tmp_path, features):
    path = tmp_path / "f.npz"
    cache.save(path, features["dev"], {"windowed_sentences": 3})
    with np.load(path, allow_pickle=False) as npz:
        assert all(npz[name].dtype != object for name in npz.files)
    stats = {}
    assert cache.load(path, stats) == features["dev"]
    assert stats == {"windowed_sentences": 3}


# --- length grouping and evaluation order -------------------------------------------------------


def make_trainer(tmp_path, model, train, dev, tokenizer, sorted_eval=True, *overrides):
    cfg = compose(*overrides)
    args = training_arguments(cfg, str(tmp_path))
    return speed.AblateTrainer(
        sorted_eval=sorted_eval,
        length_grouping=cfg.trainer.length_grouping,
        round_shapes=speed.round_shapes(cfg.trainer, args),
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=dev,
        data_collator=speed.CountingCollator(DataCollatorForTokenClassification(tokenizer)),
        processing_class=tokenizer,
        compute_metrics=TASK.compute_metrics,
        preprocess_logits_for_metrics=metrics.argmax_logits,
    )


def test_bucket_batching_yields_every_example_once_per_epoch(tmp_path, tokenizer):
    rng = np.random.default_rng(0)
    train = [
        {"input_ids": [101] * int(n), "labels": [0] * int(n)} for n in rng.integers(3, 60, 900)
    ]
    model = build()[0].model  # the sampler never calls it
    bucket = "trainer.length_grouping=bucket"
    trainer = make_trainer(tmp_path, model, train, train[:1], tokenizer, True, bucket)
    assert trainer.args.train_sampling_strategy == "group_by_length"
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, speed.LengthBucketSampler)
    epochs = [list(sampler) for _ in range(2)]
    for order in epochs:
        assert sorted(order) == list(range(len(train)))
    assert epochs[0] != epochs[1]  # reshuffled each epoch

    def padded(order):
        return sum(
            16 * max(len(train[i]["input_ids"]) for i in order[s : s + 16])
            for s in range(0, len(order), 16)
        )

    assert padded(epochs[0]) < 0.7 * padded(rng.permutation(len(train)).tolist())
    sizes = [len(b) for b in np.array_split(epochs[0], range(16, len(train), 16))]
    assert set(sizes[:-1]) == {16}  # only the last batch is short: batches stay aligned
    small = speed.LengthBucketSampler([5] * 33 + [9] * 20, batch_size=16, mega=2)
    assert sorted(small) == list(range(53)) and len(small) == 53
    default = make_trainer(tmp_path, model, train, train[:1], tokenizer)
    assert default.pack and default.args.train_sampling_strategy == "random"  # the plain batches
    with pytest.raises(AblateError, match=r"trainer\.length_grouping='sorted' is not one of"):
        make_trainer(
            tmp_path, model, train, train[:1], tokenizer, True, "trainer.length_grouping=sorted"
        )


def test_split_batches_hold_every_row_once_and_give_the_same_gradient(
    tmp_path, features, tokenizer
):
    applied, _ = build(*NO_DROPOUT)  # full fine-tuning: the word embeddings train too
    model = applied.model.train()
    train = features["train"]
    batch = speed.CountingCollator(DataCollatorForTokenClassification(tokenizer))(
        [train[i] for i in range(0, 80, 5)]
    )
    parts = speed.split_by_length(batch, cost=8)
    assert len(parts) > 1
    rows = sorted(
        tuple(r[m.bool()].tolist())
        for p in parts
        for r, m in zip(p["input_ids"], p["attention_mask"], strict=True)
    )
    assert rows == sorted(tuple(f["input_ids"]) for f in (train[i] for i in range(0, 80, 5)))
    assert sum(p["input_ids"].numel() for p in parts) < batch["input_ids"].numel()
    # trainer.round_shapes: each part's width a multiple of the quantum, the labels padded
    rounded = speed.split_by_length(batch, cost=8, quantum=speed.SHAPE_WIDTH)
    assert all(p["input_ids"].size(1) % speed.SHAPE_WIDTH == 0 for p in rounded)
    assert sum(int((p["labels"] != labels.IGNORE).sum()) for p in rounded) == int(
        (batch["labels"] != labels.IGNORE).sum()
    )
    whole = speed.split_by_length(batch, cost=10**6, quantum=speed.SHAPE_WIDTH)
    assert len(whole) == 1 and whole[0]["input_ids"].size(1) % speed.SHAPE_WIDTH == 0

    trainer = make_trainer(
        tmp_path, model, train, train[:1], tokenizer, True, "trainer.length_grouping=split"
    )
    assert trainer.sub_batch_cost > 1000  # a tiny model's sub-batch overhead: rarely worth it
    trainer.sub_batch_cost = 8  # force the split this test is about
    n_items = (batch["labels"] != labels.IGNORE).sum()
    grads, computed = [], 0
    for split in (True, False):
        trainer.length_grouping = "split" if split else "off"
        trainer.stats.reset()
        trainer.stats.active = split
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=n_items)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        if split:
            computed = len(trainer.stats.shapes)
    assert computed == len(parts) > 1  # the trainer computed the sub-batches
    (split_loss, split_grads), (loss, full_grads) = grads
    torch.testing.assert_close(split_loss, loss, atol=1e-6, rtol=1e-5)
    for a, b in zip(split_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


NO_DROPOUT = (
    "+model.config_overrides.hidden_dropout_prob=0.0",
    "+model.config_overrides.attention_probs_dropout_prob=0.0",
)


@pytest.mark.parametrize("arch", ["bert-sdpa", "bert-eager", "distilbert", "bert-lora"])
def test_packed_rows_hold_every_token_once_and_give_each_window_its_own_logits(
    arch, features, tokenizer
):
    if arch == "distilbert":
        model = tiny_distilbert().model
    elif arch == "bert-lora":  # peft passes position_ids on to the wrapped model
        model = build("freeze=lora")[0].model
    else:
        model = build()[0].model
        model.set_attn_implementation(arch.removeprefix("bert-"))
    assert speed.packing_unsupported(model) is None
    collate = speed.CountingCollator(DataCollatorForTokenClassification(tokenizer))
    batch = collate([features["train"][i] for i in range(0, 80, 5)])
    packed = speed.pack_rows(batch, model.config._attn_implementation)
    source = packed.pop("_source")
    rows, width = batch["input_ids"].shape
    assert packed["input_ids"].shape[1] >= width and packed["input_ids"].size(0) < rows / 2
    real = source < rows * width
    # every real token exactly once, padding nowhere else
    assert (
        sorted(source[real].tolist())
        == batch["attention_mask"].flatten().nonzero().squeeze(1).tolist()
    )
    assert torch.equal(packed["labels"][real], batch["labels"].flatten()[source[real]])
    assert (packed["labels"][~real] == labels.IGNORE).all()
    with torch.no_grad():
        alone = model.eval()(**batch)
        together = model(**packed)
    flat = alone.logits.reshape(rows * width, -1)
    torch.testing.assert_close(together.logits[real], flat[source[real]], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(together.loss, alone.loss, atol=1e-6, rtol=1e-5)
    assert speed.pack_rows({**batch, "attention_mask": batch["attention_mask"].flip(1)}) is None


@pytest.mark.parametrize("cached, rounded", [(False, False), (True, False), (False, True)])
def test_packed_training_step_gives_the_padded_batch_gradient(
    tmp_path, cached, rounded, features, tokenizer
):
    freezing = ["freeze=first4", "freeze.embeddings=true"] if cached else []  # else full FT
    applied, _ = build(*freezing, *NO_DROPOUT)
    train = features["train"]
    model = applied.model
    if cached:
        model = prefix.PrefixCached(model, 4, prefix.compute(model, 4, train, 16))
        train = [{**f, "prefix_index": i} for i, f in enumerate(train)]
    rounding = f"trainer.round_shapes={str(rounded).lower()}"
    trainer = make_trainer(tmp_path, model, train, train[:1], tokenizer, True, rounding)
    assert trainer.pack and trainer.packing_unsupported is None
    batch = trainer.data_collator([train[i] for i in range(0, 80, 5)])
    if rounded:  # a batch whose rounded layout adds empty rows: padding-only rows change nothing
        batch = next(
            b
            for b in (trainer.data_collator(train[i : i + 5]) for i in range(0, 100, 5))
            if [] in speed.pack_layout(b["attention_mask"].sum(1).tolist(), speed.SHAPE_WIDTH)[0]
        )
    n_items = (batch["labels"] != labels.IGNORE).sum()
    results = []
    for pack in (True, False):
        trainer.length_grouping = "pack" if pack else "off"
        trainer.stats.reset()
        trainer.stats.active = True
        model.train().zero_grad()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=n_items)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        stats = trainer.stats
        results.append((loss.detach(), grads, stats.real, stats.padded, stats.shapes))
    (loss, grads, real, padded, shapes), (plain_loss, plain_grads, plain_real, plain_padded, _) = (
        results
    )
    torch.testing.assert_close(loss, plain_loss, atol=1e-6, rtol=1e-5)
    for a, b in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert real == plain_real  # the rows it computed hold every token
    if not rounded:
        assert padded < plain_padded / 2
        return
    [(rows, width)], (batch_rows, batch_width) = shapes, batch["labels"].shape
    assert width % speed.SHAPE_WIDTH == 0 and rows % max(1, speed.SHAPE_TOKENS // width) == 0
    assert (rows, width) != (batch_rows, batch_width)  # computed as packed, not as collated


def test_pack_layout_takes_fewer_wider_rows_when_they_cost_less():
    # rows of the longest window (50) hold one window each: 6 rows, 100 padding slots
    lengths = [50, 30, 30, 30, 30, 30]
    assert len(speed._first_fit_decreasing(lengths, 50)) == 6
    bins, width = speed.pack_layout(lengths)
    assert (len(bins), width) == (4, 60)  # 50 | 30+30 | 30+30 | 30: 40 padding slots, not 100
    cost = [r * w * (1 + w / speed.PACK_ATTENTION_WIDTH) for r, w in ((len(bins), width), (6, 50))]
    assert cost[0] < cost[1]
    assert sorted(i for b in bins for i in b) == list(range(6))
    # windows that already fill rows of the longest width keep that width
    assert speed.pack_layout([40, 20, 20, 10, 30]) == ([[0], [4, 3], [1, 2]], 40)


def test_rounded_pack_layouts_hold_every_window_once_in_few_shapes():
    rng = np.random.default_rng(0)
    batches = [rng.integers(3, 90, 16).tolist() for _ in range(300)]
    shapes = {False: set(), True: set()}
    for lengths in batches:
        for rounded in (False, True):
            bins, width = speed.pack_layout(lengths, speed.SHAPE_WIDTH if rounded else None)
            assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
            assert all(sum(lengths[i] for i in b) <= width for b in bins)
            shapes[rounded].add((len(bins), width))
            if rounded:
                assert width % speed.SHAPE_WIDTH == 0
                assert len(bins) % max(1, speed.SHAPE_TOKENS // width) == 0
    assert len(shapes[True]) * 4 < len(shapes[False])


def test_round_shapes_is_on_for_bf16_on_cpu_unless_set(tmp_path, features, tokenizer):
    for overrides, expected in [
        ((), False),  # fp32: MKL has no per-shape cost, rounding would only pad
        (("trainer.bf16=true",), True),
        (("trainer.bf16=true", "trainer.round_shapes=false"), False),
        (("trainer.round_shapes=true",), True),
    ]:
        if "trainer.bf16=true" in overrides and not speed._cpu_bf16():
            continue  # training_arguments refuses bf16 on such a CPU (tested above)
        cfg = compose(*overrides)
        args = training_arguments(cfg, str(tmp_path))
        assert speed.round_shapes(cfg.trainer, args) is expected, overrides
    model, dev = build()[0].model, features["dev"]
    tags = {
        grouping: make_trainer(
            tmp_path, model, None, dev, tokenizer, True,
            "trainer.round_shapes=true", f"trainer.length_grouping={grouping}",
        ).rounding
        for grouping in ("pack", "split", "off")
    }  # fmt: skip
    assert tags["pack"].startswith(f"training widths in multiples of {speed.SHAPE_WIDTH}; packed")
    assert tags["split"] == f"training widths in multiples of {speed.SHAPE_WIDTH} (split parts)"
    assert tags["off"] == "not applied: length_grouping=off (pack and split only)"
    assert make_trainer(tmp_path, model, None, dev, tokenizer).rounding == "off"


def test_models_pack_cannot_take_fall_back_to_split_batches(tmp_path, features, tokenizer):
    bilstm = build("model.head=bilstm")[0].model
    trainer = make_trainer(tmp_path, bilstm, features["train"], features["dev"], tokenizer)
    assert trainer.length_grouping == "split" and not trainer.pack
    assert "BiLSTMTokenClassifier is not a per-token linear head" in trainer.packing_unsupported


def test_sorted_evaluation_returns_predictions_in_dataset_order(tmp_path, features, tokenizer):
    applied, _ = build()
    dev = features["dev"]
    outs = [  # batches of unequal sizes and lengths
        make_trainer(
            tmp_path, applied.model, None, dev, tokenizer, sorted_eval, "trainer.eval_batch_size=7"
        ).predict(dev)
        for sorted_eval in (True, False)
    ]
    (sorted_out, plain_out) = outs
    assert np.array_equal(sorted_out.label_ids, plain_out.label_ids)
    mask = plain_out.label_ids != labels.IGNORE
    assert np.array_equal(sorted_out.predictions[mask], plain_out.predictions[mask])
    assert sorted_out.metrics["test_accuracy"] == plain_out.metrics["test_accuracy"]
    assert sorted_out.metrics["test_words"] == labels.count_scored(dev)
    # the loss is the mean over scored labels, whatever the batches: each window alone gives it
    losses = []
    with torch.no_grad():
        for f in dev:
            out = applied.model.eval()(
                input_ids=torch.tensor([f["input_ids"]]), labels=torch.tensor([f["labels"]])
            )
            losses.append((float(out.loss) * labels.count_scored([f]), labels.count_scored([f])))
    token_mean = sum(t for t, _ in losses) / sum(n for _, n in losses)
    for out in outs:
        assert out.metrics["test_loss"] == pytest.approx(token_mean, rel=2e-6)


def test_attention_on_cuda_leaves_out_cudnn_and_cpu_is_untouched():
    backends = torch.backends.cuda
    before = (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled())
    with speed.attention_kernels(torch.device("cuda")):  # only sets torch's backend flags
        assert not backends.cudnn_sdp_enabled()
        assert backends.flash_sdp_enabled() and backends.mem_efficient_sdp_enabled()
    assert (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled()) == before
    with speed.attention_kernels(torch.device("cpu")):
        assert (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled()) == before


def test_length_batches_cut_where_padding_plus_batch_cost_is_least():
    rng = np.random.default_rng(3)
    for _ in range(40):
        lengths = rng.integers(1, 40, int(rng.integers(1, 9))).tolist()
        max_rows, cost = int(rng.integers(1, 5)), int(rng.integers(0, 30))
        batches = speed.length_batches(lengths, max_rows, cost)
        flat = [i for batch in batches for i in batch]
        assert sorted(flat) == list(range(len(lengths)))
        assert [lengths[i] for i in flat] == sorted(lengths)
        assert all(1 <= len(batch) <= max_rows for batch in batches)
        total = sum(len(b) * max(lengths[i] for i in b) + cost for b in batches)
        ordered, n = sorted(lengths), len(lengths)
        every_cut = (  # each subset of the n - 1 gaps of the sorted order
            [0] + [i + 1 for i in range(n - 1) if mask >> i & 1] + [n]
            for mask in range(2 ** (n - 1))
        )
        runs = ([*zip(c, c[1:], strict=False)] for c in every_cut)
        assert total == min(
            sum((end - start) * ordered[end - 1] + cost for start, end in r)
            for r in runs
            if all(end - start <= max_rows for start, end in r)
        )


def test_sorted_evaluation_computes_the_length_cut_batches(
    tmp_path, features, tokenizer, monkeypatch
):
    # the tiny model's blocks are so small that one more batch would cost more than any padding
    monkeypatch.setattr(speed, "sub_batch_cost", lambda model: 4)
    applied, _ = build()
    dev = features["dev"]
    trainer = make_trainer(
        tmp_path, applied.model, None, dev, tokenizer, True, "trainer.eval_batch_size=16"
    )
    shapes, collate = [], trainer.data_collator

    def recording(batch):
        out = collate(batch)
        shapes.append(tuple(out["input_ids"].shape))
        return out

    trainer.data_collator = recording
    trainer.predict(dev)
    lengths = [len(f["input_ids"]) for f in dev]
    expected = speed.length_batches(lengths, 16, 4)
    assert shapes == [(len(b), max(lengths[i] for i in b)) for b in expected]
    ordered = sorted(lengths)
    fixed = sum(len(ordered[i : i + 16]) * ordered[i : i + 16][-1] for i in range(0, len(dev), 16))
    assert sum(rows * width for rows, width in shapes) < fixed


@pytest.mark.skipif(not speed._cpu_bf16(), reason="this CPU has no bf16 (AVX-512 BF16 / AMX)")
def test_bf16_evaluation_casts_each_weight_once_with_the_same_predictions(
    tmp_path, features, tokenizer
):
    applied, _ = build()
    dev = features["dev"]
    trainer = make_trainer(
        tmp_path, applied.model, None, dev, tokenizer, True, "trainer.bf16=true",
        "trainer.eval_batch_size=8",
    )  # fmt: skip
    outs, casts = [], []
    for once in (True, False):
        if not once:  # each batch's forward casts the weights again, as before
            trainer._weights_cast_once = contextlib.nullcontext
        with torch.profiler.profile() as prof:
            outs.append(trainer.predict(dev))
        casts.append(sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy"))
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in applied.model.modules())
    lengths = [len(f["input_ids"]) for f in dev]
    batches = len(speed.length_batches(lengths, 8, trainer.eval_batch_cost))
    # two tensors (weight, bias) per linear layer: cast once instead of once per batch
    assert casts[1] - casts[0] == 2 * n_linear * (batches - 1)
    assert np.array_equal(outs[0].predictions, outs[1].predictions)
    assert outs[0].metrics["test_accuracy"] == outs[1].metrics["test_accuracy"]


def test_final_dev_predictions_reuse_the_last_epoch_evaluation(tmp_path, features, tokenizer):
    applied, _ = build()
    train, dev = features["train"][:32], features["dev"]
    trainer = make_trainer(tmp_path, applied.model, train, dev, tokenizer, True, "trainer.epochs=1")
    trainer.train()
    step, kept = trainer.last_evaluation
    assert step == trainer.state.global_step > 0  # the epoch's dev evaluation, after training
    predictions, label_ids = trainer.predictions(dev)
    assert predictions is kept.predictions  # no second pass over dev
    fresh = trainer.predict(dev)  # what a second pass computes: the same
    assert np.array_equal(predictions, fresh.predictions)
    assert np.array_equal(label_ids, fresh.label_ids)
    test = features["dev"][:5]  # another dataset is predicted anew
    assert trainer.predictions(test)[0] is not kept.predictions
    assert len(trainer.predictions(test)[1]) == 5


# --- frozen-prefix caching ----------------------------------------------------------------------


def tiny_distilbert():
    config = DistilBertConfig(
        vocab_size=30522, dim=32, n_layers=6, n_heads=2, hidden_dim=64, num_labels=len(LABEL2ID)
    )
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_config(config)
    return freeze.apply(model, compose("freeze=first4", "freeze.embeddings=true").freeze)


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
    collate = speed.CountingCollator(DataCollatorForTokenClassification(tokenizer))
    rows = [{**train[i], "prefix_index": i} for i in (0, 5, 17, 33, 60)]  # various lengths
    batch = collate(rows)
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
    collate = speed.CountingCollator(DataCollatorForTokenClassification(tokenizer))
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
    cfg = compose("model=tiny", "freeze=first2", "freeze.embeddings=true")
    task = tasks.get("sst2")
    applied = freeze.apply(model_lib.build(cfg.model, task.model_class, task.labels), cfg.freeze)
    pooler = model_lib.pooler(applied.model)  # in the encoder, trains with the head
    assert pooler is not None and all(p.requires_grad for p in pooler.parameters())
    assert prefix.frozen_prefix(applied) == (2, None)


def test_cache_frozen_off_or_invalid_leaves_the_model_alone(features, tokenizer):
    for overrides, tag in (
        (["freeze=first4", "freeze.embeddings=true", "trainer.cache_frozen_eval=false"], "off"),
        (["freeze=first4", "trainer.cache_frozen=true"], "not applied: embedding parameters train"),
    ):
        applied, cfg = build(*overrides)
        run = FakeRun()
        model, feats = prefix.wrap(cfg, applied, features, tokenizer, run)
        assert model is applied.model and feats is features
        assert run.tag_log["speed.cache_frozen"].startswith(tag)
        assert run.tag_log["speed.cache_frozen_eval"].startswith(tag)


def test_a_cached_forward_that_differs_is_refused_or_left_out(features, tokenizer, monkeypatch):
    real = prefix._prefix_output
    # an encoder whose blocks do not compose as prefix.py assumes: the cached output is off
    monkeypatch.setattr(prefix, "_prefix_output", lambda *a: real(*a) + 0.5)
    applied, cfg = build("freeze=first4", "freeze.embeddings=true")
    run = FakeRun()
    model, feats = prefix.wrap(cfg, applied, features, tokenizer, run)  # eval cache: on by default
    assert model is applied.model and feats is features  # evaluated the usual way
    assert run.tag_log["speed.cache_frozen_eval"].startswith("not applied: the cached forward")
    applied, cfg = build("freeze=first4", "freeze.embeddings=true", "trainer.cache_frozen=true")
    with pytest.raises(AblateError, match="trainer.cache_frozen: the cached forward .* differs"):
        prefix.wrap(cfg, applied, features, tokenizer, FakeRun())  # asked for: an error


def test_a_cached_forward_that_fails_leaves_dev_evaluation_the_usual_way(
    features, tokenizer, monkeypatch
):
    def fails(*args):
        raise RuntimeError("sequence length should be a multiple of 4")

    monkeypatch.setattr(prefix, "_prefix_output", fails)
    applied, cfg = build("freeze=first4", "freeze.embeddings=true")
    run = FakeRun()
    model, feats = prefix.wrap(cfg, applied, features, tokenizer, run)
    assert model is applied.model and feats is features
    assert run.tag_log["speed.cache_frozen_eval"] == (
        "not applied: RuntimeError: sequence length should be a multiple of 4"
    )


def test_dev_evaluations_after_the_first_reuse_the_frozen_prefix(features, tokenizer):
    applied, cfg = build("freeze=first4", "freeze.embeddings=true")  # cache_frozen_eval: default
    full = copy.deepcopy(applied.model).eval()  # the same weights, evaluated the usual way
    run = FakeRun()
    wrapped, feats = prefix.wrap(cfg, applied, features, tokenizer, run)
    assert run.tag_log["speed.cache_frozen"] == "off"  # training runs the full model
    assert run.tag_log["speed.cache_frozen_eval"].startswith("dev windows: embeddings + blocks 0-3")
    assert feats["train"] is features["train"] and wrapped.store is None
    assert [f["eval_index"] for f in feats["dev"]] == list(range(len(features["dev"])))
    prefix_calls = []
    block0 = model_lib.blocks(applied.model)[0]
    block0.register_forward_hook(lambda module, args, out: prefix_calls.append(1))
    collate = speed.CountingCollator(DataCollatorForTokenClassification(tokenizer))
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


@pytest.mark.parametrize(("sorted_eval", "bf16"), [(True, False), (False, True)])
def test_the_trainers_dev_evaluations_reuse_the_kept_prefix(
    tmp_path, features, tokenizer, sorted_eval, bf16
):
    overrides = ("freeze=first4", "freeze.embeddings=true", f"trainer.bf16={str(bf16).lower()}")
    applied, cfg = build(*overrides)
    full = copy.deepcopy(applied.model)
    wrapped, feats = prefix.wrap(cfg, applied, features, tokenizer, FakeRun())
    calls = []
    model_lib.blocks(applied.model)[0].register_forward_hook(lambda *args: calls.append(1))
    trainer = make_trainer(
        tmp_path / "cached", wrapped, feats["train"], feats["dev"], tokenizer, sorted_eval,
        *overrides,
    )  # fmt: skip
    first = trainer.predict(feats["dev"])
    after_first = len(calls)
    second = trainer.predict(feats["dev"])
    assert after_first > 0 and len(calls) == after_first  # no block below 4 ran the second time
    plain = make_trainer(
        tmp_path / "full", full, features["train"], features["dev"], tokenizer, sorted_eval,
        *overrides,
    )  # fmt: skip
    expected = plain.predict(features["dev"])
    scored = expected.label_ids != IGNORE  # padded positions' logits come from other inputs
    for out in (first, second):
        np.testing.assert_array_equal(out.label_ids, expected.label_ids)
        np.testing.assert_array_equal(out.predictions[scored], expected.predictions[scored])
        assert out.metrics["test_accuracy"] == expected.metrics["test_accuracy"]


def test_checkpoints_of_a_prefix_cached_model_are_the_wrapped_models(tmp_path, features, tokenizer):
    def wrapped_model():
        applied, cfg = build("freeze=first4", "freeze.embeddings=true")
        wrapped, feats = prefix.wrap(cfg, applied, features, tokenizer, FakeRun())
        assert isinstance(wrapped, prefix.PrefixCached)
        return applied.model, wrapped, feats

    inner, wrapped, feats = wrapped_model()
    with torch.no_grad():
        inner.classifier.weight.add_(1.0)  # unlike a fresh build's
    trained = inner.classifier.weight.detach().clone()
    cached = make_trainer(tmp_path / "a", wrapped, feats["train"], feats["dev"], tokenizer)
    cached.save_model(str(tmp_path / "from-cached"))
    by_hand = AutoModelForTokenClassification.from_pretrained(tmp_path / "from-cached")
    assert torch.equal(by_hand.classifier.weight, trained)
    # resumed where the caches do not apply (trainer.cache_frozen_eval=false, older code) ...
    plain = build("freeze=first4", "freeze.embeddings=true")[0].model
    uncached = make_trainer(tmp_path / "b", plain, features["train"], features["dev"], tokenizer)
    uncached._load_from_checkpoint(str(tmp_path / "from-cached"))
    assert torch.equal(plain.classifier.weight, trained)
    # ... and the other way round
    uncached.save_model(str(tmp_path / "from-plain"))
    inner, wrapped, feats = wrapped_model()
    cached = make_trainer(tmp_path / "c", wrapped, feats["train"], feats["dev"], tokenizer)
    cached._load_from_checkpoint(str(tmp_path / "from-plain"))
    assert torch.equal(inner.classifier.weight, trained)


# --- embedding rows -----------------------------------------------------------------------------


def test_training_only_the_used_embedding_rows_updates_like_the_full_table(
    tmp_path, features, tokenizer
):
    applied, _ = build()
    dense = applied.model
    sparse = copy.deepcopy(dense)
    train, dev = features["train"][:48], features["dev"]
    rows = embedding_rows.apply(sparse, train)
    used = set(embedding_rows.used_ids(train).tolist())
    unseen = [i for f in dev for i in f["input_ids"] if i not in used]
    assert unseen and rows.trained.shape[0] == len(used) < rows.num_embeddings / 5
    initial = dense.get_input_embeddings().weight.detach().clone()
    # lr and weight decay large enough that a missing decay of the unseen rows would show
    steep = ("trainer.epochs=1", "trainer.lr=0.01", "trainer.weight_decay=0.1")
    for name, model in (("dense", dense), ("rows", sparse)):
        trainer = make_trainer(tmp_path / name, model, train, dev, tokenizer, True, *steep)
        if model is sparse:
            trainer.add_callback(embedding_rows.DecayUntrainedRows(rows))
        trainer.train()
    table = dense.get_input_embeddings().weight.detach()
    assert not torch.allclose(table[unseen], initial[unseen])  # decayed, not trained
    torch.testing.assert_close(rows.merged(), table, atol=1e-6, rtol=1e-5)
    others = [(n, p) for n, p in sparse.named_parameters() if "word_embeddings" not in n]
    for name, param in others:
        torch.testing.assert_close(param, dense.get_parameter(name), atol=1e-6, rtol=1e-4)
    # a checkpoint holds the trained table: loaded by hand into a plain model, or resumed
    trainer.save_model(str(tmp_path / "saved"))
    by_hand = AutoModelForTokenClassification.from_pretrained(tmp_path / "saved")
    assert type(by_hand.get_input_embeddings()) is torch.nn.Embedding
    torch.testing.assert_close(
        by_hand.get_input_embeddings().weight.detach(), table, atol=1e-6, rtol=1e-5
    )
    resumed = build()[0].model  # as a resumed run builds it: initial weights, then the rows
    resumed_rows = embedding_rows.apply(resumed, train)
    resumed.load_state_dict(sparse.state_dict())
    torch.testing.assert_close(resumed_rows.merged(), table, atol=1e-6, rtol=1e-5)
    batch = DataCollatorForTokenClassification(tokenizer)(dev[:16])
    batch.pop("labels")
    with torch.no_grad():
        logits = [m.eval()(**batch).logits for m in (sparse, dense, by_hand, resumed)]
    for other in logits[1:]:
        torch.testing.assert_close(logits[0], other, atol=1e-5, rtol=1e-4)


def test_embedding_rows_leave_the_padding_row_untrained_like_nn_embedding():
    torch.manual_seed(0)
    dense = torch.nn.Embedding(50, 8, padding_idx=0)
    with torch.no_grad():
        dense.weight[0] = torch.randn(8)  # so that a wrong update of the padding row would show
    rows = embedding_rows.RowsEmbedding(copy.deepcopy(dense), torch.tensor([0, 3, 5, 7, 3]))
    assert rows.rows.tolist() == [3, 5, 7]
    optimisers = [
        torch.optim.AdamW(params, lr=0.1, weight_decay=0.5)
        for params in (dense.parameters(), [rows.trained])
    ]
    embedding_rows.DecayUntrainedRows(rows).on_train_begin(None, None, None, optimisers[1])
    ids, target = torch.tensor([[3, 0, 5], [7, 7, 0]]), torch.randn(2, 3, 8)
    for _ in range(5):
        for module, opt in zip((dense, rows), optimisers, strict=True):
            opt.zero_grad()
            ((module(ids) - target) ** 2).sum().backward()
            opt.step()
    torch.testing.assert_close(rows.merged(), dense.weight.detach())
    every = torch.arange(50)
    torch.testing.assert_close(rows(every), dense(every).detach())


@pytest.mark.parametrize(
    ("overrides", "tag"),
    [
        (["freeze=none"], "rows train"),
        (["freeze=last2"], "rows train"),
        (["freeze=none", "trainer.embedding_rows=false"], "off"),
        (
            ["freeze=first4", "freeze.embeddings=true"],
            "not applied: the word embeddings are frozen",
        ),
        (["freeze=llrd"], "not applied: the strategy sets its own optimiser groups"),
        (["freeze=gradual"], "not applied: the strategy sets its own optimiser groups"),
        (["freeze=lora"], "not applied: the word embeddings are frozen"),
    ],
)
def test_embedding_rows_apply_only_where_the_update_stays_the_same(overrides, tag, features):
    applied, cfg = build(*overrides)
    before = model_lib.unwrap(applied.model).get_input_embeddings()
    run = FakeRun()
    callbacks = embedding_rows.wrap(cfg, applied, applied.model, features["train"], run)
    after = model_lib.unwrap(applied.model).get_input_embeddings()
    assert tag in run.tag_log["speed.embedding_rows"]
    assert (after is not before) == bool(callbacks) == (tag == "rows train")


# --- fast dropout masks -------------------------------------------------------------------------


def test_fast_dropout_keeps_each_element_with_probability_1_minus_p_and_scales_it():
    x = torch.ones(1_000_000, requires_grad=True)
    torch.manual_seed(0)
    out = dropout.fast_dropout(x, 0.1)
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.9) < 5 * (0.9 * 0.1 / x.numel()) ** 0.5
    assert torch.equal(out[kept], torch.full_like(out[kept], 1 / 0.9))
    out.sum().backward()
    assert torch.equal(x.grad, out.detach())  # the gradient goes through the same mask
    torch.manual_seed(0)
    assert torch.equal(dropout.fast_dropout(x, 0.1), out)  # torch's seeded generator
    module = dropout.FastDropout(0.1)
    assert torch.equal(module.eval()(x), x) and torch.equal(dropout.FastDropout(0.0)(x), x)
    for tiny in (1e-9, 1e-10, 1e-12):  # keep probability 1 - p, not 0, below 2^-32 too
        assert (dropout.fast_dropout(x.detach(), tiny) != 0).float().mean() > 0.999999


def test_fast_dropout_attention_is_the_masked_softmax_product_with_its_mask():
    torch.manual_seed(1)
    rows, heads, width, dim = 3, 4, 10, 8
    q, k, v = (torch.randn(rows, heads, width, dim) for _ in range(3))
    window = torch.tensor([0] * 4 + [1] * 6)
    mask = (window[:, None] == window[None, :]).expand(rows, 1, width, width)

    class Attention(torch.nn.Module):
        is_causal = False

    module = Attention()
    torch.manual_seed(2)
    out, _ = dropout.attention(module, q, k, v, mask, dropout=0.25)
    torch.manual_seed(2)  # the same draws, by the formula
    scores = torch.einsum("rhid,rhjd->rhij", q, k) / dim**0.5
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    keep = torch.empty(probs.shape, dtype=torch.int32).random_() < round(0.75 * 2**31)
    expected = torch.einsum("rhij,rhjd->rihd", probs * keep / 0.75, v)
    torch.testing.assert_close(out, expected)
    # no dropout (evaluation): transformers' sdpa attention itself
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(dropout.attention(module, q, k, v, mask)[0], plain.transpose(1, 2))


def test_bf16_training_attention_takes_the_product_path_without_dropout():
    torch.manual_seed(1)
    rows, heads, width, dim = 3, 4, 10, 8
    q, k, v = (torch.randn(rows, heads, width, dim, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.ones(rows, 1, width, width, dtype=torch.bool).tril()

    class Attention(torch.nn.Module):
        is_causal = False

    module = Attention()
    flash = "aten::_scaled_dot_product_flash_attention_for_cpu"
    ops, outs = {}, {}
    for training in (True, False):
        module.train(training)
        with torch.profiler.profile() as prof:
            outs[training] = dropout.attention(module, q, k, v, mask)[0]
        ops[training] = {e.key for e in prof.key_averages()}
    assert flash not in ops[True] and flash in ops[False]  # evaluation keeps sdpa
    scores = torch.einsum("rhid,rhjd->rhij", q.float(), k.float()) / dim**0.5
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    expected = torch.einsum("rhij,rhjd->rihd", probs, v.float())
    for out in outs.values():  # bf16 rounding apart, the same attention
        torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)
    no_dropout = build(*NO_DROPOUT)[0].model
    assert dropout.skip_reason(no_dropout, torch.device("cpu")) == (
        "no nn.Dropout module with 0 < p < 1"
    )
    assert dropout.skip_reason(no_dropout, torch.device("cpu"), bf16=True) is None
    assert "bf16 training on the matrix-product path" in dropout.apply(no_dropout, bf16=True)
    assert no_dropout.config._attn_implementation == dropout.ATTENTION


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_fast_dropout_swaps_masks_only_and_leaves_evaluation_as_it_was(arch, features, tokenizer):
    model = tiny_distilbert().model if arch == "distilbert" else build()[0].model
    batch = DataCollatorForTokenClassification(tokenizer)(features["dev"][:8])
    with torch.no_grad():
        before = model.eval()(**batch).logits
    assert dropout.skip_reason(model, torch.device("cuda")).startswith("device cuda")
    assert dropout.skip_reason(model, torch.device("cpu")) is None
    done = dropout.apply(model)
    modules = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert modules and all(type(m) is dropout.FastDropout for m in modules)
    assert done.startswith(f"{len(modules)} dropout modules") and dropout.ATTENTION in done
    assert model.config._attn_implementation == dropout.ATTENTION
    assert speed.packing_unsupported(model) is None
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, before, atol=0, rtol=0)
    model.train()
    torch.manual_seed(3)
    first = model(**batch).loss
    first.backward()
    torch.manual_seed(3)
    assert torch.equal(model(**batch).loss, first)  # seeded, and not evaluation's loss
    assert not torch.isclose(first, model.eval()(**batch).loss)


# --- precision and optimiser settings -----------------------------------------------------------


def test_gpu_and_cpu_training_arguments():
    t = compose().trainer
    gpu = speed.training_kwargs(t, cuda=True, bf16_ok=True, tf32_ok=True)
    assert gpu == {
        "train_sampling_strategy": "random",  # length_grouping=split keeps the random batches
        "optim": "adamw_torch_fused",
        "bf16": True,
        "dataloader_pin_memory": True,
        "tf32": True,
    }
    cpu = speed.training_kwargs(t, cuda=False, bf16_ok=True, tf32_ok=False)
    assert cpu["bf16"] is False and "tf32" not in cpu and cpu["dataloader_pin_memory"] is False
    opt_in = compose("trainer.bf16=true").trainer
    assert speed.training_kwargs(opt_in, cuda=False, bf16_ok=True, tf32_ok=False)["bf16"] is True
    with pytest.raises(AblateError, match=r"trainer\.bf16=true: this CPU"):
        speed.training_kwargs(opt_in, cuda=False, bf16_ok=False, tf32_ok=False)
    off = compose("trainer.fused_adamw=false", "trainer.tf32=false", "trainer.bf16=false").trainer
    gpu_off = speed.training_kwargs(off, cuda=True, bf16_ok=True, tf32_ok=True)
    assert gpu_off["optim"] == "adamw_torch" and not gpu_off["bf16"] and "tf32" not in gpu_off


# --- the bench's arithmetic ---------------------------------------------------------------------


def fake_job(config, recipe, epoch_s, eval_s, acc, cache_s=0.0):
    return {
        "config": config,
        "recipe": recipe,
        "result": {
            "epoch_time_s": [epoch_s, epoch_s],
            "dev_eval_time_s": [eval_s, eval_s],
            "dev_accuracy": [0.5, acc],
            "train_tokens": [1000, 1000],
            "padding_pct": [10, 10],
            "train_flops_per_epoch": 1e9 * epoch_s,
            "tokenize_time_s": 1.0,
            "cache_frozen_time_s": cache_s,
            "rss_mb": 500,
            "wall_s": 60,
        },
    }


def test_bench_table_ratios_charge_the_prefix_cache_to_the_epochs():
    jobs = [
        fake_job("full", "plain", 10, 3, 0.900),
        fake_job("full", "ablate", 4, 1, 0.901),
        fake_job("full", "bucket", 3, 1, 0.880),
        fake_job("first4", "plain", 10, 3, 0.8),
        fake_job("first4", "ablate", 1, 1, 0.8, cache_s=2.0),  # 1 s/epoch + 2 s once = 2 s/epoch
        fake_job("nodrop", "plain", 10, 3, 0.75),
        fake_job("nodrop", "ablate", 4, 1, 0.7525),
    ]
    summary = bench.summarise(jobs, epochs=2, peak=1e10)
    text, comparisons = bench.table(
        summary, ["full", "first4", "nodrop"], epochs=2, recipes=("ablate", "bucket")
    )
    assert comparisons["full.ablate.train_s_ratio"] == pytest.approx(0.4)
    assert comparisons["full.bucket.train_s_ratio"] == pytest.approx(0.3)
    assert comparisons["first4.ablate.train_s_ratio"] == pytest.approx(0.2)
    assert comparisons["full.ablate.eval_s_ratio"] == pytest.approx(1 / 3)
    assert comparisons["full.ablate.dev_acc_diff_pt"] == pytest.approx(0.1)
    assert comparisons["full.bucket.dev_acc_diff_pt"] == pytest.approx(-2.0)
    assert comparisons["first4.ablate.tokens_per_s_ratio"] == pytest.approx(5.0)
    assert "<= 0.4: ablate: met, bucket: met" in text
    assert "<= 0.33: ablate: missed, bucket: missed" in text
    assert "within 0.2 pt: ablate: met, bucket: missed" in text
    assert "| +0.25 pt |  |  | within 0.2 pt: ablate: missed |" in text  # nodrop: no bucket job
    assert text.count("\n") == 2 + 3 * len(bench.ROWS)


def test_bench_rates_come_from_mean_tokens_over_mean_time():
    # two rounds of ablate, one much faster: tokens/s must agree with the mean train time
    jobs = [fake_job("full", "plain", 10, 3, 0.9), fake_job("full", "plain", 10, 3, 0.9)]
    jobs += [fake_job("full", "ablate", 1, 1, 0.9), fake_job("full", "ablate", 9, 1, 0.9)]
    summary = bench.summarise(jobs, epochs=2, peak=1e10)
    _, comparisons = bench.table(summary, ["full"], epochs=2, recipes=("ablate",))
    assert comparisons["full.ablate.train_s_ratio"] == pytest.approx(0.5)
    assert comparisons["full.ablate.tokens_per_s_ratio"] == pytest.approx(2.0)
    assert summary[("full", "ablate")]["flops_pct"] == pytest.approx(10.0)  # 5 GFLOP / 5 s / 10


def test_bench_nodrop_turns_off_every_dropout_of_the_architecture():
    from transformers import DistilBertConfig, DistilBertForTokenClassification

    overrides = bench.dropout_off("tiny")
    cfg = compose("model=tiny", *overrides)
    net = model_lib.build(cfg.model, AutoModelForTokenClassification, TASK.labels)
    drops = [m.p for m in net.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and not any(drops)
    keys = dict.fromkeys(bench.DROPOUT_KEYS["distilbert"], 0.0)
    distil = DistilBertForTokenClassification(
        DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, **keys)
    )
    drops = [m.p for m in distil.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and not any(drops)


def test_bench_compares_pos_tagging_only(tmp_path):
    with pytest.raises(AblateError, match=r"--data sst2: task 'sst2'; the bench compares POS"):
        bench.main(
            ["--data", "sst2", "--out", str(tmp_path), "--uri", f"sqlite:///{tmp_path}/m.db"]
        )


def test_bench_runs_its_jobs_and_logs_the_table_it_computed(tmp_path, store, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # main() sets it for its jobs; restored after
    temp = tmp_path / "tmp"  # the bench's and its jobs' temporary folders
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "bench"
    sizes = ["--train-sentences", "24", "--dev-sentences", "8", "--test-sentences", "4"]
    rc = bench.main(
        ["--model", "tiny", *sizes, "--epochs", "1", "--repeats", "1", "--configs", "nodrop"]
        + ["--recipes", "ablate", "--uri", store, "--out", str(out)]
        + ["--omp-wait-policy", "PASSIVE"]
    )
    assert rc == 0
    assert list(temp.iterdir()) == []  # its data slice, caches, logs and trainer folders are gone
    text = (out / "bench.md").read_text()
    assert "| full FT without dropout | train time per epoch (s) |" in text
    logged = json.loads((out / "bench.json").read_text())
    jobs = {job["recipe"]: job["result"] for job in logged["jobs"]}
    assert list(jobs) == ["plain", "ablate"]
    ratio = jobs["ablate"]["epoch_time_s"][0] / jobs["plain"]["epoch_time_s"][0]
    assert logged["ratios"]["nodrop.ablate.train_s_ratio"] == pytest.approx(ratio)
    assert f"| {ratio:.2f} |" in text
    # Without dropout masks ablate computes what plain computes: the same training loss (the
    # logged epoch mean, 4 decimals) and dev accuracy. The tiny model barely learns in two steps,
    # so this checks the bench's plumbing; the packing tests above check the gradients exactly.
    assert jobs["ablate"]["padding_pct"][0] < jobs["plain"]["padding_pct"][0]  # it packed
    assert jobs["ablate"]["train_loss"] == pytest.approx(jobs["plain"]["train_loss"], abs=1e-4)
    assert jobs["ablate"]["dev_accuracy"] == jobs["plain"]["dev_accuracy"]
    assert logged["ratios"]["nodrop.ablate.dev_acc_diff_pt"] == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("ablate-bench").experiment_id])
    roles = sorted(r.data.tags.get("bench.recipe") or r.data.tags["bench.role"] for r in runs)
    assert roles == ["ablate", "plain", "summary"]
    (summary,) = [r for r in runs if r.data.tags.get("bench.role") == "summary"]
    assert summary.data.metrics["nodrop.ablate.train_s_ratio"] == pytest.approx(ratio)


def test_bench_first4_study_trains_the_studys_embeddings_in_plain_only(tmp_path, store):
    sizes = ["--train-sentences", "24", "--dev-sentences", "8", "--test-sentences", "4"]
    rc = bench.main(
        ["--model", "tiny", *sizes, "--epochs", "1", "--repeats", "1"]
        + ["--configs", "first4_study", "--recipes", "ablate", "--uri", store]
        + ["--out", str(tmp_path / "bench")]
    )
    assert rc == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("ablate-bench").experiment_id])
    jobs = {r.data.tags["bench.recipe"]: r for r in runs if "bench.recipe" in r.data.tags}
    params = {k: r.data.params for k, r in jobs.items()}
    assert params["plain"]["freeze.first"] == params["ablate"]["freeze.first"] == "4"
    assert params["plain"]["freeze.embeddings"] == "False"  # as the earlier study ran first4
    assert params["ablate"]["freeze.embeddings"] == "True"
    assert params["ablate"]["trainer.cache_frozen"] == "True"
    logged = json.loads((tmp_path / "bench" / "bench.json").read_text())
    flops = {job["recipe"]: job["result"]["train_flops_per_epoch"] for job in logged["jobs"]}
    # plain's backward runs down to the embeddings; ablate runs blocks 4.. only, on packed rows
    assert flops["plain"] > 3 * flops["ablate"] > 0
    text = (tmp_path / "bench" / "bench.md").read_text()
    assert "| freeze=first4 (plain: embeddings train, as the study ran it" in text


# --- a real sweep -------------------------------------------------------------------------------


@pytest.mark.skipif(not speed._cpu_bf16(), reason="this CPU has no bf16 (AVX-512 BF16 / AMX)")
def test_real_bf16_runs_train_on_rounded_batch_shapes(slice_root, store, tmp_path):
    proc = run_cli(
        "--multirun",
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.bf16=true",
        "trainer.round_shapes=null,false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.data.params["trainer.round_shapes"]: r for r in logged_runs(store)}
    assert {k: r.info.status for k, r in runs.items()} == {"None": "FINISHED", "False": "FINISHED"}
    assert (
        runs["None"]
        .data.tags["speed.round_shapes"]
        .startswith(f"training widths in multiples of {speed.SHAPE_WIDTH}")
    )
    assert runs["False"].data.tags["speed.round_shapes"] == "off"
    padding = {k: r.data.metrics["padding_pct"] for k, r in runs.items()}
    assert padding["None"] > padding["False"] > 0  # the rounded rows' extra padding


def test_real_sweep_dev_evaluations_from_the_kept_prefix_give_the_same_numbers(
    slice_root, store, tmp_path
):
    proc = run_cli(
        "--multirun",
        *slice_overrides(slice_root, store, tmp_path),
        "freeze=head_only",  # the whole encoder frozen: later evaluations run only the head
        "skip_finished=false",  # explicit: the switch is not part of a run's identity
        "trainer.cache_frozen_eval=true,false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    runs = {r.data.params["trainer.cache_frozen_eval"]: r for r in logged_runs(store)}
    assert {k: r.info.status for k, r in runs.items()} == {"True": "FINISHED", "False": "FINISHED"}
    assert (
        runs["True"]
        .data.tags["speed.cache_frozen_eval"]
        .startswith("dev windows: embeddings + blocks 0-")
    )
    assert runs["False"].data.tags["speed.cache_frozen_eval"] == "off"
    assert runs["True"].data.tags["ablate.identity"] == runs["False"].data.tags["ablate.identity"]

    def history(run):
        points = client.get_metric_history(run.info.run_id, "dev_accuracy")
        return [p.value for p in sorted(points, key=lambda p: p.step)]

    def predictions(run):
        path = client.download_artifacts(run.info.run_id, "predictions/dev.json", str(tmp_path))
        return json.loads(Path(path).read_text())

    assert len(history(runs["True"])) == 2
    assert history(runs["True"]) == history(runs["False"])
    assert predictions(runs["True"]) == predictions(runs["False"])
    for metric in ("test_accuracy", "dev_accuracy"):
        assert runs["True"].data.metrics[metric] == runs["False"].data.metrics[metric]


def test_real_sweep_reuses_tokenisation_and_trains_on_the_cached_prefix(
    slice_root, store, tmp_path
):
    proc = run_cli(
        "--multirun",
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.epochs=1",
        "freeze=first4",
        "freeze.embeddings=true",
        "trainer.cache_frozen=true",
        f"data.tokenized_cache_dir={tmp_path / 'tokenized'}",
        "seed=1,2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("ablate")
    runs = {r.data.params["seed"]: r for r in client.search_runs([exp.experiment_id])}
    assert {s: r.info.status for s, r in runs.items()} == {"1": "FINISHED", "2": "FINISHED"}
    assert runs["1"].data.tags["data.cache"] == "miss"
    assert runs["2"].data.tags["data.cache"] == "hit"
    for run in runs.values():
        assert run.data.tags["speed.cache_frozen"] == "embeddings + blocks 0-3"
        assert dropout.ATTENTION in run.data.tags["speed.fast_dropout"]
        assert run.data.tags["speed.length_grouping"] == "pack"  # with that attention too
        assert run.data.tags["speed.round_shapes"] == "off"  # fp32: rounding would only pad
        m = run.data.metrics
        assert m["cache_frozen_time_s"] > 0 and m["train_tokens_per_s"] > 0
        assert m["dev_eval_time_s"] > 0 and 0 <= m["dev_accuracy"] <= 1
        assert m["dev_words"] == runs["1"].data.metrics["dev_words"] > 0
