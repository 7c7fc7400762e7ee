"""Numerics and kernels: ``trainer.fused_adamw``, ``bf16``, ``tf32``, ``pin_memory``,
``compile`` and ``attention_kernels`` (the TrainingArguments they set, and CUDA's attention
kernel choice)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch

from ablate.errors import AblateError
from ablate.plugins import Context, Plugin

log = logging.getLogger(__name__)


def cpu_bf16() -> bool:
    """Whether this CPU runs bf16 autocast (AVX-512 BF16 or AMX, as torch itself checks)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX512", "AVX512_BF16", "AMX"):
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_on_cpu(args) -> bool:
    """Whether TrainingArguments ``args`` train in bf16 on a CPU."""
    return bool(args.bf16) and args.device.type == "cpu"


def arguments(
    t, cuda: bool | None = None, bf16_ok: bool | None = None, tf32_ok: bool | None = None
) -> dict[str, Any]:
    """TrainingArguments for ``trainer``'s numeric switches on this machine (or the one described:
    ``cuda``/``bf16_ok``/``tf32_ok`` default to what torch reports here; tests pass them to check
    the GPU configuration on a CPU machine)."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if bf16_ok is None:
        bf16_ok = torch.cuda.is_bf16_supported() if cuda else cpu_bf16()
    if tf32_ok is None:
        tf32_ok = cuda and torch.cuda.get_device_capability()[0] >= 8
    bf16 = (cuda and bf16_ok) if t.bf16 is None else bool(t.bf16)
    if bf16 and not bf16_ok:
        where = "this GPU" if cuda else "this CPU (it needs AVX-512 BF16 or AMX)"
        raise AblateError(f"trainer.bf16=true: {where} has no bfloat16 support")
    kwargs: dict[str, Any] = {
        "optim": "adamw_torch_fused" if t.fused_adamw else "adamw_torch",
        "bf16": bf16,
        "dataloader_pin_memory": bool(cuda and t.pin_memory),
    }
    if cuda and t.tf32 and tf32_ok:
        kwargs["tf32"] = True
    if t.compile != "off":  # the Trainer compiles the model it trains (torch_compile_mode)
        mode = None if t.compile == "default" else t.compile
        kwargs.update(torch_compile=True, torch_compile_mode=mode)
    return kwargs


def attention_kernels(device: torch.device) -> contextlib.AbstractContextManager:
    """Scaled-dot-product attention without cuDNN's kernel on CUDA: for bf16 with a mask torch
    picks it, and it built an execution plan on the CPU at every call (~11 ms on an H100, ~40x
    the kernel itself), so bf16 training on packed batches ran 5x slower than fp32. Flash and
    memory-efficient attention need no plan."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(kernels)


class AttentionKernelsMixin:
    """Trainer mixin: ``attention_kernels`` around the two entry points of a forward (training
    and prediction steps)."""

    def training_step(self, *args, **kwargs):
        with attention_kernels(self.args.device):
            return super().training_step(*args, **kwargs)

    def prediction_step(self, *args, **kwargs):
        with attention_kernels(self.args.device):
            return super().prediction_step(*args, **kwargs)


class Precision(Plugin):
    name = "precision"
    switches = (
        "trainer.fused_adamw",
        "trainer.bf16",
        "trainer.tf32",
        "trainer.pin_memory",
        "trainer.compile",
        "trainer.attention_kernels",
    )

    eager: str | None = None  # why a compile asked for does not apply to this run's strategy

    def check(self, ctx: Context) -> None:
        arguments(ctx.cfg.trainer, cuda=ctx.device == "cuda")

    def arguments(self, ctx: Context) -> dict[str, Any]:
        kwargs = arguments(ctx.cfg.trainer, cuda=ctx.device == "cuda")
        if kwargs.get("torch_compile") and (why := ctx.applied.eager_only):
            del kwargs["torch_compile"], kwargs["torch_compile_mode"]
            self.eager = f"not applied: freeze={ctx.cfg.freeze.name} trains eagerly ({why})"
            log.info("trainer.compile=%s: %s", ctx.cfg.trainer.compile, self.eager)
        return kwargs

    def prepare(self, ctx: Context) -> dict[str, str]:
        status = {"compile": self.eager} if self.eager else {}
        if ctx.device != "cuda":
            return status
        if not ctx.cfg.trainer.attention_kernels:
            return {**status, "attention_kernels": "off"}
        ctx.mixins.append(AttentionKernelsMixin)
        return {**status, "attention_kernels": "flash, memory-efficient or math; no cuDNN"}
