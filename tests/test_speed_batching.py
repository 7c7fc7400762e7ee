"""Batch layout (pack, split, bucket, round_shapes) and sorted evaluation: the same losses,
gradients and predictions as the plain batches, with less padding."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from helpers.runs import FakeRecorder
from helpers.speed import NO_DROPOUT, TASK, build, compose, make_trainer, tiny_distilbert
from transformers import DataCollatorForTokenClassification

from ablate.data.encode import IGNORE, count_scored
from ablate.errors import AblateError
from ablate.speed import batching
from ablate.speed.grouping import packing_unsupported
from ablate.speed.precision import attention_kernels, cpu_bf16
from ablate.speed.prefix import PrefixCached, compute
from ablate.training.prepare import check_switches


def collate(tokenizer, rows):
    return DataCollatorForTokenClassification(tokenizer)(rows)


def test_bucket_batching_yields_every_example_once_per_epoch(tmp_path, tokenizer):
    rng = np.random.default_rng(0)
    train = [
        {"input_ids": [101] * int(n), "labels": [0] * int(n)} for n in rng.integers(3, 60, 900)
    ]
    model = build()[0].model  # the sampler never calls it
    bucket = "trainer.length_grouping=bucket"
    trainer = make_trainer(tmp_path, model, train, train[:1], tokenizer, bucket)
    assert trainer.args.train_sampling_strategy == "group_by_length"
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, batching.LengthBucketSampler)
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
    small = batching.LengthBucketSampler([5] * 33 + [9] * 20, batch_size=16, mega=2)
    assert sorted(small) == list(range(53)) and len(small) == 53
    default = make_trainer(tmp_path, model, train, train[:1], tokenizer)
    assert default.length_grouping == "pack"
    assert default.args.train_sampling_strategy == "random"  # the plain recipe's batches
    with pytest.raises(AblateError, match=r"trainer\.length_grouping='sorted' is not one of"):
        check_switches(compose("trainer.length_grouping=sorted"))


def test_split_batches_hold_every_row_once_and_give_the_same_gradient(
    tmp_path, features, tokenizer
):
    applied, _ = build(*NO_DROPOUT)  # full fine-tuning: the word embeddings train too
    model = applied.model.train()
    train = features["train"]
    batch = collate(tokenizer, [train[i] for i in range(0, 80, 5)])
    parts = batching.split_by_length(batch, cost=8)
    assert len(parts) > 1
    rows = sorted(
        tuple(r[m.bool()].tolist())
        for p in parts
        for r, m in zip(p["input_ids"], p["attention_mask"], strict=True)
    )
    assert rows == sorted(tuple(f["input_ids"]) for f in (train[i] for i in range(0, 80, 5)))
    assert sum(p["input_ids"].numel() for p in parts) < batch["input_ids"].numel()
    # trainer.round_shapes: each part's width a multiple of the quantum, the labels padded
    rounded = batching.split_by_length(batch, cost=8, quantum=batching.SHAPE_WIDTH)
    assert all(p["input_ids"].size(1) % batching.SHAPE_WIDTH == 0 for p in rounded)
    assert sum(int((p["labels"] != IGNORE).sum()) for p in rounded) == int(
        (batch["labels"] != IGNORE).sum()
    )
    whole = batching.split_by_length(batch, cost=10**6, quantum=batching.SHAPE_WIDTH)
    assert len(whole) == 1 and whole[0]["input_ids"].size(1) % batching.SHAPE_WIDTH == 0

    trainer = make_trainer(
        tmp_path, model, train, train[:1], tokenizer, "trainer.length_grouping=split"
    )
    assert trainer.sub_batch_cost > 1000  # a tiny model's sub-batch overhead: rarely worth it
    trainer.sub_batch_cost = 8  # force the split this test is about
    n_items = (batch["labels"] != IGNORE).sum()
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
    assert packing_unsupported(model) is None
    batch = collate(tokenizer, [features["train"][i] for i in range(0, 80, 5)])
    packed = batching.pack_rows(batch, model.config._attn_implementation)
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
    assert (packed["labels"][~real] == IGNORE).all()
    with torch.no_grad():
        alone = model.eval()(**batch)
        together = model(**packed)
    flat = alone.logits.reshape(rows * width, -1)
    torch.testing.assert_close(together.logits[real], flat[source[real]], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(together.loss, alone.loss, atol=1e-6, rtol=1e-5)
    assert batching.pack_rows({**batch, "attention_mask": batch["attention_mask"].flip(1)}) is None


@pytest.mark.parametrize("cached, rounded", [(False, False), (True, False), (False, True)])
def test_packed_training_step_gives_the_padded_batch_gradient(
    tmp_path, cached, rounded, features, tokenizer
):
    freezing = ["freeze=first4", "freeze.embeddings=true"] if cached else []  # else full FT
    applied, _ = build(*freezing, *NO_DROPOUT)
    train = features["train"]
    model = applied.model
    if cached:
        model = PrefixCached(model, 4, compute(model, 4, train, 16))
        train = [{**f, "prefix_index": i} for i, f in enumerate(train)]
    rounding = f"trainer.round_shapes={str(rounded).lower()}"
    trainer = make_trainer(tmp_path, model, train, train[:1], tokenizer, rounding)
    assert trainer.length_grouping == "pack" and trainer.speed_status["length_grouping"] == "pack"
    collator = trainer.data_collator
    if cached:  # the training windows' cache index rides along, stacked
        from ablate.speed.cache_frozen import StackIndices

        collator = StackIndices(collator)
    batch = collator([train[i] for i in range(0, 80, 5)])
    if rounded:  # a batch whose rounded layout adds empty rows: padding-only rows change nothing
        batch = next(
            b
            for b in (collator(train[i : i + 5]) for i in range(0, 100, 5))
            if []
            in batching.pack_layout(b["attention_mask"].sum(1).tolist(), batching.SHAPE_WIDTH)[0]
        )
    n_items = (batch["labels"] != IGNORE).sum()
    results = []
    for pack in (True, False):
        trainer.length_grouping = "pack" if pack else "off"
        trainer.stats.reset()
        trainer.stats.active = True
        model.train().zero_grad()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=n_items)
        if not pack:  # the padded batch, as the stock Trainer would compute and count it
            trainer.stats.add(batch)
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
    assert width % batching.SHAPE_WIDTH == 0
    assert rows % max(1, batching.SHAPE_TOKENS // width) == 0
    assert (rows, width) != (batch_rows, batch_width)  # computed as packed, not as collated


def test_pack_layout_takes_fewer_wider_rows_when_they_cost_less():
    # rows of the longest window (50) hold one window each: 6 rows, 100 padding slots
    lengths = [50, 30, 30, 30, 30, 30]
    assert len(batching.first_fit_decreasing(lengths, 50)) == 6
    bins, width = batching.pack_layout(lengths)
    assert (len(bins), width) == (4, 60)  # 50 | 30+30 | 30+30 | 30: 40 padding slots, not 100
    cost = [
        r * w * (1 + w / batching.PACK_ATTENTION_WIDTH) for r, w in ((len(bins), width), (6, 50))
    ]
    assert cost[0] < cost[1]
    assert sorted(i for b in bins for i in b) == list(range(6))
    # windows that already fill rows of the longest width keep that width
    assert batching.pack_layout([40, 20, 20, 10, 30]) == ([[0], [4, 3], [1, 2]], 40)


def test_rounded_pack_layouts_hold_every_window_once_in_few_shapes():
    rng = np.random.default_rng(0)
    batches = [rng.integers(3, 90, 16).tolist() for _ in range(300)]
    shapes = {False: set(), True: set()}
    for lengths in batches:
        for rounded in (False, True):
            bins, width = batching.pack_layout(lengths, batching.SHAPE_WIDTH if rounded else None)
            assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
            assert all(sum(lengths[i] for i in b) <= width for b in bins)
            shapes[rounded].add((len(bins), width))
            if rounded:
                assert width % batching.SHAPE_WIDTH == 0
                assert len(bins) % max(1, batching.SHAPE_TOKENS // width) == 0
    assert len(shapes[True]) * 4 < len(shapes[False])


def test_round_shapes_is_on_for_bf16_on_cpu_and_compiled_unless_set(tmp_path, features, tokenizer):
    model, dev = build()[0].model, features["dev"]

    def rounding(*overrides):
        trainer = make_trainer(tmp_path, model, None, dev, tokenizer, *overrides)
        return trainer.speed_status["round_shapes"]

    width = batching.SHAPE_WIDTH
    assert rounding() == "off"  # fp32: MKL has no per-shape cost, rounding would only pad
    # compiled: every new shape is a compile (past torch's recompile limit the model runs eager)
    assert rounding("trainer.compile=default").startswith(
        f"training widths in multiples of {width}"
    )
    assert rounding("trainer.compile=default", "trainer.round_shapes=false") == "off"
    assert rounding("trainer.round_shapes=true").startswith(
        f"training widths in multiples of {width}"
    )
    if cpu_bf16():  # null = on for bf16 on a CPU; refused on CPUs without bf16 (precision tests)
        assert rounding("trainer.bf16=true") != "off"
        assert rounding("trainer.bf16=true", "trainer.round_shapes=false") == "off"
    tags = {
        grouping: rounding("trainer.round_shapes=true", f"trainer.length_grouping={grouping}")
        for grouping in ("pack", "split", "off")
    }
    assert tags["pack"].startswith(f"training widths in multiples of {width}; packed")
    assert tags["split"] == f"training widths in multiples of {width} (split parts)"
    assert tags["off"] == "not applied: length_grouping=off (pack and split only)"


def test_a_strategy_whose_trainable_weights_change_trains_eagerly_under_compile(
    tmp_path, features, tokenizer
):
    from ablate.training.fit import build_trainer

    applied, cfg = build("freeze=gradual", "trainer.compile=default")
    trainer, status = build_trainer(
        cfg, TASK, applied, {"train": None, "dev": features["dev"]}, tokenizer, FakeRecorder(),
        "cpu", str(tmp_path),
    )  # fmt: skip
    assert not trainer.args.torch_compile  # each epoch's unfreezing would recompile it
    assert status["compile"].startswith("not applied: freeze=gradual trains eagerly (its ")
    assert status["round_shapes"] == "off"  # nothing compiled: in fp32 rounding only pads
    # a strategy whose trainable weights stay the same: compiled, its shapes rounded
    kept = make_trainer(tmp_path, build()[0].model, None, features["dev"], tokenizer,
                        "trainer.compile=default")  # fmt: skip
    assert kept.args.torch_compile and "compile" not in kept.speed_status
    assert kept.speed_status["round_shapes"] != "off"


def test_models_pack_cannot_take_fall_back_to_split_batches(tmp_path, features, tokenizer):
    bilstm = build("model.head=bilstm")[0].model
    trainer = make_trainer(tmp_path, bilstm, features["train"], features["dev"], tokenizer)
    assert trainer.length_grouping == "split"
    assert trainer.speed_status["length_grouping"] == (
        "split (pack: BiLSTMTokenClassifier is not a per-token linear head)"
    )


def test_sorted_evaluation_returns_predictions_in_dataset_order(tmp_path, features, tokenizer):
    applied, _ = build()
    dev = features["dev"]
    outs = [  # batches of unequal sizes and lengths
        make_trainer(
            tmp_path, applied.model, None, dev, tokenizer, f"trainer.sorted_eval={on}",
            "trainer.eval_batch_size=7",
        ).predict(dev)
        for on in ("true", "false")
    ]  # fmt: skip
    (sorted_out, plain_out) = outs
    assert np.array_equal(sorted_out.label_ids, plain_out.label_ids)
    mask = plain_out.label_ids != IGNORE
    assert np.array_equal(sorted_out.predictions[mask], plain_out.predictions[mask])
    assert sorted_out.metrics["test_accuracy"] == plain_out.metrics["test_accuracy"]
    assert sorted_out.metrics["test_words"] == count_scored(dev)
    # the loss is the mean over scored labels, whatever the batches: each window alone gives it
    losses = []
    with torch.no_grad():
        for f in dev:
            out = applied.model.eval()(
                input_ids=torch.tensor([f["input_ids"]]), labels=torch.tensor([f["labels"]])
            )
            losses.append((float(out.loss) * count_scored([f]), count_scored([f])))
    token_mean = sum(t for t, _ in losses) / sum(n for _, n in losses)
    for out in outs:
        assert out.metrics["test_loss"] == pytest.approx(token_mean, rel=2e-6)


def test_attention_on_cuda_leaves_out_cudnn_and_cpu_is_untouched():
    backends = torch.backends.cuda
    before = (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled())
    with attention_kernels(torch.device("cuda")):  # only sets torch's backend flags
        assert not backends.cudnn_sdp_enabled()
        assert backends.flash_sdp_enabled() and backends.mem_efficient_sdp_enabled()
    assert (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled()) == before
    with attention_kernels(torch.device("cpu")):
        assert (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled()) == before


def test_length_batches_cut_where_padding_plus_batch_cost_is_least():
    rng = np.random.default_rng(3)
    for _ in range(40):
        lengths = rng.integers(1, 40, int(rng.integers(1, 9))).tolist()
        max_rows, cost = int(rng.integers(1, 5)), int(rng.integers(0, 30))
        batches = batching.length_batches(lengths, max_rows, cost)
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
    monkeypatch.setattr(batching, "sub_batch_cost", lambda model: 4)
    applied, _ = build()
    dev = features["dev"]
    trainer = make_trainer(
        tmp_path, applied.model, None, dev, tokenizer, "trainer.eval_batch_size=16"
    )
    shapes, collator = [], trainer.data_collator

    def recording(batch):
        out = collator(batch)
        shapes.append(tuple(out["input_ids"].shape))
        return out

    trainer.data_collator = recording
    trainer.predict(dev)
    lengths = [len(f["input_ids"]) for f in dev]
    expected = batching.length_batches(lengths, 16, 4)
    assert shapes == [(len(b), max(lengths[i] for i in b)) for b in expected]
    ordered = sorted(lengths)
    fixed = sum(len(ordered[i : i + 16]) * ordered[i : i + 16][-1] for i in range(0, len(dev), 16))
    assert sum(rows * width for rows, width in shapes) < fixed


@pytest.mark.skipif(not cpu_bf16(), reason="this CPU has no bf16 (AVX-512 BF16 / AMX)")
def test_bf16_evaluation_casts_each_weight_once_with_the_same_predictions(
    tmp_path, features, tokenizer
):
    applied, _ = build()
    dev = features["dev"]
    trainer = make_trainer(
        tmp_path, applied.model, None, dev, tokenizer, "trainer.bf16=true",
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
    batches = len(batching.length_batches(lengths, 8, trainer.eval_batch_cost))
    # two tensors (weight, bias) per linear layer: cast once instead of once per batch
    assert casts[1] - casts[0] == 2 * n_linear * (batches - 1)
    assert np.array_equal(outs[0].predictions, outs[1].predictions)
    assert outs[0].metrics["test_accuracy"] == outs[1].metrics["test_accuracy"]
