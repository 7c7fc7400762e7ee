"""``trainer.fast_dropout``: dropout masks from 32-bit integer draws on CPU.

torch's CPU dropout draws its masks with ``bernoulli_``, about 6 ns per element on this project's
machines; ``random_()`` on int32 takes about 1.8 ns. A MiniLM full fine-tuning step draws ~5 M
mask elements. An element is kept when its draw in [0, 2^31) is below round((1 - p) * 2^31), so
the keep probability is exact to 2^-31 and kept elements are scaled by 1 / (1 - p), as in
``nn.Dropout``. The masks have the same distribution but come from another random stream (still
torch's seeded CPU generator, saved in checkpoints): results differ from torch's dropout by
seed noise only.

Two places draw masks in a BERT-like encoder: its ``nn.Dropout`` modules, swapped here for
``FastDropout``, and attention-probability dropout inside SDPA. On CPU, SDPA with dropout takes
its math path (scores, softmax, dropout, product) anyway, so ``attention`` runs the same math
with ``fast_dropout``'s mask. It is registered with transformers' ``AttentionInterface`` as
``ablate_sdpa`` and hands everything but CPU training with dropout to transformers' own sdpa
function, except bf16 training on CPU, which it keeps on the math path even without dropout
(torch's CPU flash attention with gradients is several times slower there in bf16). GPUs keep
torch's dropout (a fused kernel there).
"""

from __future__ import annotations

import torch
from torch import nn

from ablate.plugins import Context, Plugin

ATTENTION = "ablate_sdpa"
_DRAWS = 2**31  # int32 random_() draws uniformly from [0, 2^31)


def fast_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``x`` with each element zeroed with probability ``p`` and the rest scaled by 1/(1-p)."""
    keep = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    # capped: for p below 2^-32 the threshold would round to 2^31, past int32, and keep nothing
    keep = keep < min(round((1.0 - p) * _DRAWS), _DRAWS - 1)
    # a float mask: its product's backward is one multiply (a bool mask took longer here)
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


def _applies(x: torch.Tensor, p: float, training: bool) -> bool:
    return training and 0.0 < p < 1.0 and x.device.type == "cpu"


class FastDropout(nn.Dropout):
    """``nn.Dropout`` whose CPU training masks come from ``fast_dropout``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _applies(x, self.p, self.training):
            return super().forward(x)
        return fast_dropout(x, self.p)


def attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs
):
    """transformers' sdpa attention, with the math path's dropout mask from ``fast_dropout``.

    bf16 training on CPU takes the math path without dropout too: torch's CPU flash attention in
    bf16 with gradients took 4-6 times as long here (``trainer.bf16`` with no attention dropout).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    drop = _applies(query, dropout, True)
    if (
        not (drop or _bf16_cpu_training(module, query))
        or key.shape[1] != query.shape[1]  # grouped key/value heads: transformers repeats them
        or getattr(module, "is_causal", False)
        or kwargs.get("is_causal")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query * scaling, key.transpose(2, 3))  # scaling the smaller operand
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # sdpa's masks: True = attend
            scores = torch.where(attention_mask, scores, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1)
    if drop:
        probs = fast_dropout(probs, dropout)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


def _bf16_cpu_training(module: nn.Module, x: torch.Tensor) -> bool:
    training = getattr(module, "training", False) and torch.is_grad_enabled()
    return training and x.dtype == torch.bfloat16 and x.device.type == "cpu"


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # 2-D masks become sdpa's bool masks


def skip_reason(model: nn.Module, device: torch.device, bf16: bool = False) -> str | None:
    """Why ``apply`` leaves ``model`` as it is (None: it applies). With ``bf16`` (training under
    bf16 autocast) it applies without dropout too, for the attention's math path."""
    if device.type != "cpu":
        return f"device {device.type} (torch's dropout is a fused kernel there)"
    if not bf16 and not any(type(m) is nn.Dropout and 0.0 < m.p < 1.0 for m in model.modules()):
        return "no nn.Dropout module with 0 < p < 1"
    return None


def apply(model: nn.Module, bf16: bool = False) -> str:
    """Swap ``model``'s ``nn.Dropout`` modules for ``FastDropout`` and its sdpa attention for
    ``attention``, in place; returns what was swapped, for the run's tag."""
    swaps = [
        (module, name, child)
        for module in model.modules()
        for name, child in module.named_children()
        if type(child) is nn.Dropout  # subclasses may draw their masks otherwise
    ]
    for module, name, child in swaps:
        setattr(module, name, FastDropout(child.p, child.inplace).train(child.training))
    done = f"{len(swaps)} dropout modules"
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    sdpa = [c for c in configs.values() if getattr(c, "_attn_implementation", None) == "sdpa"]
    if sdpa:
        _register()
        for config in sdpa:
            config._attn_implementation = ATTENTION
        bf16_path = ", and bf16 training on the matrix-product path" if bf16 else ""
        done += f", attention-probability dropout{bf16_path} ({ATTENTION})"
    return done


class Dropout(Plugin):
    name = "dropout"
    switches = ("trainer.fast_dropout",)

    def attach(self, ctx: Context, trainer) -> dict[str, str]:
        if not ctx.value("trainer.fast_dropout"):
            return {"fast_dropout": "off"}
        bf16 = bool(trainer.args.bf16)
        reason = skip_reason(trainer.model, trainer.args.device, bf16)
        if reason is not None:
            return {"fast_dropout": f"not applied: {reason}"}
        return {"fast_dropout": apply(trainer.model, bf16)}
