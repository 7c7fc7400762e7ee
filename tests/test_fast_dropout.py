"""The fast dropout plugin (``ablate.speed.dropout``): its masks, its attention on the
matrix-product path, and a model with it swapped in, which evaluates as it did."""

from __future__ import annotations

import pytest
import torch
from helpers.speed import NO_DROPOUT, build, tiny_distilbert
from transformers import DataCollatorForTokenClassification

from ablate.speed import dropout
from ablate.speed.grouping import packing_unsupported


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
    assert packing_unsupported(model) is None
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, before, atol=0, rtol=0)
    model.train()
    torch.manual_seed(3)
    first = model(**batch).loss
    first.backward()
    torch.manual_seed(3)
    assert torch.equal(model(**batch).loss, first)  # seeded, and not evaluation's loss
    assert not torch.isclose(first, model.eval()(**batch).loss)
