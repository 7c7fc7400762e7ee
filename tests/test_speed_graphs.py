"""``trainer.cuda_graph``'s CPU-testable parts: batches packed into fixed shapes, the fixed-shape
step against the eager one, the step's forward, backward and clipping compiled whole, no host
sync anywhere in the step (optimizer included), and the capture and replay plumbing inside the
Trainer with ``Replay`` standing in for the graph."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.speed import NO_DROPOUT, build, make_trainer
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DataCollatorForTokenClassification

from ablate.data.encode import IGNORE
from ablate.speed import graphs, shapes


class NoHostSync(TorchDispatchMode):
    """Refuses ``aten._local_scalar_dense``: the op behind ``.item()``, ``bool(tensor)`` and
    ``.tolist()`` of a device tensor, where the host waits for the device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            raise AssertionError("the step read a tensor's value back to the host")
        return func(*args, **(kwargs or {}))


def _batches(features, tokenizer, sizes=(8, 8, 5, 8)):
    collate = DataCollatorForTokenClassification(tokenizer)
    out, start = [], 0
    for n in sizes:
        out.append(collate(features["train"][start : start + n]))
        start += n
    return out


def _optimizer(model, lr=1e-3):
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.01, fused=True
    )


def _graphed(model, lr=1e-3, backend=None):
    optimizer = _optimizer(model, lr)
    step = graphs.capturable(optimizer, torch.device("cpu"))
    return graphs.GraphedStep(
        model, optimizer, step, graphs.MAX_GRAD_NORM, backend or graphs.Replay()
    )


def _fixed(batch):
    packed = shapes.fixed(batch, shapes.Shapes.for_batches(8, 128), "sdpa")
    packed.pop("_source")
    return packed


def test_batches_pack_into_the_cheapest_fixed_shape(features, tokenizer):
    fixed = shapes.Shapes.for_batches(16, 128)
    assert fixed.rows == (1, 2, 4, 8, 16) and fixed.widths == (32, 64, 128)
    assert shapes.Shapes.for_batches(12, 100).widths == (32, 64, 100 + 28)
    bins, width = fixed.layout([30, 30, 30, 5])  # 95 tokens: 4 x 32 is cheaper than 2 x 64
    assert (len(bins), width) == (4, 32) and sorted(i for b in bins for i in b) == [0, 1, 2, 3]
    bins, width = fixed.layout([100, 20, 3])  # the long window sets the width; rows a power of 2
    assert (len(bins), width) == (1, 128)
    batch = _batches(features, tokenizer, (8,))[0]
    packed = shapes.fixed(batch, fixed, "sdpa")
    rows, wide = packed["input_ids"].shape
    assert rows in fixed.rows and wide in fixed.widths
    source = packed.pop("_source")
    real = source < batch["input_ids"].numel()
    # every real token once, with its label; padding slots are ignored by the loss
    assert real.sum() == batch["attention_mask"].sum()
    flat = batch["labels"].flatten()
    assert torch.equal(packed["labels"][real], flat[source[real]])
    assert (packed["labels"][~real] == IGNORE).all()
    assert packed["attention_mask"].shape == (rows, 1, wide, wide)


def test_the_fixed_shape_step_equals_the_eager_step_without_dropout(features, tokenizer):
    applied, _ = build(*NO_DROPOUT)
    eager_model = applied.model
    graph_model = copy.deepcopy(eager_model)
    eager_opt = _optimizer(eager_model)
    graphed = _graphed(graph_model)
    seen = set()
    for batch in _batches(features, tokenizer, (8, 8, 1, 8)):  # two shapes, one replayed
        eager_model.train()
        eager_opt.zero_grad()
        loss = eager_model(**batch).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(eager_model.parameters(), graphs.MAX_GRAD_NORM)
        grads = [p.grad.clone() for p in eager_model.parameters() if p.requires_grad]
        eager_opt.step()
        graph_model.train()
        fixed = _fixed(batch)
        seen.add(shapes.shape_of(fixed))
        graphed_loss = graphed(fixed)
        torch.testing.assert_close(graphed_loss, loss.detach(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(graphed.norm, norm, atol=1e-6, rtol=1e-5)
        for ours, theirs in zip(graphed.grads, grads, strict=True):
            torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4)
    assert graphed.backend.captures == len(seen) == 2  # one capture per shape
    for ours, theirs in zip(graph_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4)


def test_the_fixed_shape_step_with_dropout_is_within_seed_noise(features, tokenizer):
    applied, _ = build()  # the tiny model's dropout on
    batch = _batches(features, tokenizer, (8,))[0]
    fixed = _fixed(batch)
    losses = {"eager": [], "fixed": []}
    for seed in range(24):
        for name, inputs in (("eager", batch), ("fixed", fixed)):
            torch.manual_seed(seed)
            with torch.no_grad():
                losses[name].append(float(applied.model.train()(**inputs).loss))
    eager, fixed_ = torch.tensor(losses["eager"]), torch.tensor(losses["fixed"])
    assert eager.std() > 0 and fixed_.std() > 0  # dropout drew other masks each seed
    spread = ((eager.var() + fixed_.var()) / len(eager)).sqrt()
    assert abs(eager.mean() - fixed_.mean()) < 4 * spread


def test_the_step_forward_backward_and_clipping_compile_whole(features, tokenizer):
    applied, _ = build(*NO_DROPOUT)
    model = applied.model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    batch = _fixed(_batches(features, tokenizer, (8,))[0])

    def step(inputs):
        loss = model(**inputs).loss
        loss.backward()
        return loss.detach(), torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(step, fullgraph=True, backend="eager")  # a break raises
        loss, norm = compiled(batch)
    grads = [p.grad.clone() for p in params]
    model.zero_grad()
    want_loss, want_norm = step(batch)
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(norm, want_norm)
    for p, g in zip(params, grads, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_nothing_in_the_step_syncs_with_the_host(features, tokenizer):
    applied, _ = build(*NO_DROPOUT)
    graphed = _graphed(applied.model.train())
    first, again, other = (_fixed(b) for b in _batches(features, tokenizer, (8, 8, 3)))
    with NoHostSync():
        graphed(first)  # eager: the shape's first batch, then its capture
        graphed(again)  # a replay: the batch copied into the static buffers
        graphed(other)  # a new shape
    # the check itself catches a sync: an unpacked batch's 2-D mask makes transformers ask
    # whether every position is attended (a host read)
    with pytest.raises(AssertionError, match="read a tensor's value back"), NoHostSync():
        graphs.GraphedStep.step(graphed, _batches(features, tokenizer, (8,))[0])


def test_capture_and_replay_plumbing(features, tokenizer):
    applied, _ = build(*NO_DROPOUT)
    model = applied.model.train()
    graphed = _graphed(model, lr=1e-3)
    a, b = (_fixed(x) for x in _batches(features, tokenizer, (8, 8)))
    graphed(a)
    static, _ = graphed.graphs[shapes.shape_of(a)]
    where = {k: v.data_ptr() for k, v in static.items()}
    grads = [g.data_ptr() for g in graphed.grads]
    model.zero_grad()  # as the Trainer does after each step: the step points .grad back
    graphed(b)
    assert {k: v.data_ptr() for k, v in static.items()} == where  # copied in, not replaced
    assert torch.equal(static["input_ids"], b["input_ids"])
    assert [g.data_ptr() for g in graphed.grads] == grads
    # the lr is a tensor the schedule fills: at 0 the replayed step leaves the weights alone
    scheduler = torch.optim.lr_scheduler.LambdaLR(graphed.optimizer, lambda step: 0.0)
    lr = graphed.optimizer.param_groups[0]["lr"]
    assert torch.is_tensor(lr) and float(lr) == 0.0 and scheduler.base_lrs == [1e-3]
    before = [p.detach().clone() for p in graphed.params]
    graphed(a)  # lr 0: no update and no decay
    for p, was in zip(graphed.params, before, strict=True):
        assert torch.equal(p, was)
    assert graphed.backend.captures == 1
    # gradual unfreezing: a new trainable set drops the graphs and captures again
    frozen = next(p for p in model.parameters() if p.requires_grad)
    frozen.requires_grad_(False)
    graphed(a)
    assert graphed.recaptures == 1 and graphed.backend.captures == 2
    assert all(p is not frozen for p in graphed.params)


def test_a_run_trains_through_the_captured_step_in_the_trainer(
    tmp_path, features, tokenizer, monkeypatch
):
    """The plugin as on a GPU, ``Replay`` for the graph: the same weights as the eager Trainer's
    (packed batches there too; dropout off), the optimizer stepped and clipped once a step."""
    monkeypatch.setattr(graphs, "why_eager", lambda ctx: None)
    monkeypatch.setattr(graphs, "CudaGraphs", graphs.Replay)
    train, dev = features["train"][:40], features["dev"][:8]
    applied, _ = build(*NO_DROPOUT)
    eager_model, graph_model = applied.model, copy.deepcopy(applied.model)
    steep = ("trainer.epochs=2", "trainer.lr=0.003", "trainer.batch_size=8", *NO_DROPOUT)
    eager = make_trainer(tmp_path / "eager", eager_model, train, dev, tokenizer, *steep)
    graph = make_trainer(
        tmp_path / "graph", graph_model, train, dev, tokenizer, *steep, "trainer.cuda_graph=true"
    )
    assert graph.speed_status["cuda_graph"].startswith("the whole step captured")
    assert eager.speed_status["cuda_graph"] == "off"
    assert graph.args.max_grad_norm == 0 and not graph.args.logging_nan_inf_filter
    eager_out, graph_out = eager.train(), graph.train()
    assert graph.graphed is not None and graph.graphed.backend.captures >= 1
    torch.testing.assert_close(graph_out.training_loss, eager_out.training_loss, rtol=1e-4, atol=0)
    for ours, theirs in zip(graph_model.parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-3)


def test_on_a_cpu_the_switch_says_why_the_step_trains_eagerly(tmp_path, features, tokenizer):
    applied, _ = build()
    trainer = make_trainer(
        tmp_path, applied.model, features["train"][:8], features["dev"][:4], tokenizer,
        "trainer.cuda_graph=true",
    )  # fmt: skip
    assert trainer.speed_status["cuda_graph"] == "not applied: no GPU (a CUDA graph needs one)"
    assert trainer.args.max_grad_norm == graphs.MAX_GRAD_NORM
