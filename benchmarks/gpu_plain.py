"""The plain Hugging Face Trainer recipes ``bench_gpu.py`` measures ablate against, and the
per-step clock every recipe of the bench (ablate's too) trains under.

- ``plain``: the earlier study's recipe (``shared.plain_fit``'s arguments), fp32;
- ``plain_tf32``: the same with ``tf32=True``;
- ``plain_bf16``: the same with ``bf16=True``, what a user adds for a GPU;
- ``plain_bf16_nocudnn``: bf16 with cuDNN's attention turned off
  (``torch.backends.cuda.enable_cudnn_sdp(False)``: on Hopper SDPA prefers it, and it builds a
  plan for each new (batch, length) shape);
- ``best_plain``: what a competent user picks: bf16 (TF32 where the GPU has no bf16), fused
  AdamW, no cuDNN attention, eval batches of 64 with the argmax taken on the device
  (``preprocess_logits_for_metrics``), no per-step NaN check (``logging_nan_inf_filter=False``,
  whose ``isnan`` waits on the GPU every step);
- ``best_plain_compiled``: ``best_plain`` with ``torch_compile=True`` (on ``--dry-run``'s CPU
  with dynamo's ``eager`` backend: the same tracing, no code generation, to keep it short).
"""

from __future__ import annotations

import time

from transformers import TrainerCallback

from ablate.plugins import Plugin

BEST = {"bf16": "auto", "cudnn_sdp": False, "optim": "adamw_torch_fused", "eval_batch": 64,
        "argmax_on_device": True, "nan_filter": False}  # fmt: skip
RECIPES = {
    "plain": {},
    "plain_tf32": {"tf32": True},
    "plain_bf16": {"bf16": True},
    "plain_bf16_nocudnn": {"bf16": True, "cudnn_sdp": False},
    "best_plain": BEST,
    "best_plain_compiled": {**BEST, "compile": True},
}


class StepTimer(TrainerCallback):
    """Per optimizer step: the epoch, its milliseconds from the previous step's end (or the
    epoch's start; data loading included) and the (batch, length) shapes it computed, read from
    the meter's ``BatchStats`` (the collated batch, or the rows a Trainer mixin computed). On a
    GPU a CUDA event marks each step's end on the stream, read once the epoch ends: no step
    waits for the GPU, so the epoch's time is not changed by timing it. On the CPU, wall clock."""

    def __init__(self, stats, steps: list) -> None:
        import torch

        self.stats, self.steps = stats, steps
        self.cuda = torch.cuda.is_available()
        self._k, self._cursor, self._epoch = 0, 0, 0
        self._marks: list = []  # the epoch's start, then each step's end: event or time
        self._shapes: list[str] = []

    def _mark(self):
        import torch

        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch += 1
        self._k = self._cursor = 0
        self._marks, self._shapes = [self._mark()], []

    def on_step_end(self, args, state, control, **kwargs):
        self._marks.append(self._mark())
        shapes = self.stats.shapes
        if self.stats.by_trainer:  # the rows computed in this step
            mine, self._cursor = shapes[self._cursor :], len(shapes)
        else:  # the loader collates ahead: the k-th collated batch is the k-th step's
            mine = shapes[self._k : self._k + 1]
        self._shapes.append("+".join(f"{b}x{n}" for b, n in mine) or "?")
        self._k += 1

    def on_epoch_end(self, args, state, control, **kwargs):
        marks = self._marks
        if self.cuda and len(marks) > 1:
            marks[-1].synchronize()
            ms = [a.elapsed_time(b) for a, b in zip(marks, marks[1:], strict=False)]
        else:
            ms = [1e3 * (b - a) for a, b in zip(marks, marks[1:], strict=False)]
        self.steps += [[self._epoch, t, shape] for t, shape in zip(ms, self._shapes, strict=True)]
        self._marks, self._shapes = [], []


def resolved(recipe: str) -> dict:
    """``recipe``'s settings on this machine: ``bf16="auto"`` is bf16 where the GPU (or the CPU)
    has it, else TF32; TF32 only on a CUDA GPU; compiling on the CPU with dynamo's eager
    backend."""
    import torch

    knobs = dict(RECIPES[recipe])
    cuda = torch.cuda.is_available()
    if knobs.get("bf16") == "auto":
        knobs["bf16"] = torch.cuda.is_bf16_supported() if cuda else True
        knobs["tf32"] = cuda and not knobs["bf16"]
    if knobs.get("tf32") and not cuda:
        knobs["tf32"] = None  # TF32 is a CUDA setting: the CPU job runs in fp32
        knobs["note"] = "tf32: not available on cpu"
    if knobs.get("compile") and not cuda:
        knobs["compile_backend"] = "eager"
    return knobs


def fit(cfg, run, output_dir: str, recipe: str, steps: list) -> dict:
    """``recipe`` on ``cfg``'s data, model, freezing and optimisation settings (the plain recipe,
    ``shared.plain_fit``, with the recipe's knobs), recorded through ``run`` (a ``Recorder``),
    each step's time into ``steps``; returns the settings it used."""
    import torch
    from shared import plain_fit

    knobs = resolved(recipe)
    if knobs.get("compile"):  # a worker's earlier jobs count towards dynamo's recompile limit
        torch._dynamo.reset()
    plain_fit(
        cfg, run, output_dir, knobs, measure_flops=False,
        callbacks=lambda collator: [StepTimer(collator.stats, steps)],
    )  # fmt: skip
    return {k: v for k, v in knobs.items() if v is not None}


class StepTimerPlugin(Plugin):
    """An ablate training plugin (``ablate.plugins``) that puts a ``StepTimer`` on ablate's
    Trainer, reading the meter's collator: the bench times ablate's steps as it times the plain
    recipes', without a change to ablate. ``steps`` is where the running job's steps go."""

    name = "bench-step-timer"
    steps: list = []

    def attach(self, ctx, trainer) -> dict:
        trainer.add_callback(StepTimer(ctx.collator.stats, StepTimerPlugin.steps))
        return {}
