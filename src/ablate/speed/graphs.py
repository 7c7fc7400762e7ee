"""``trainer.cuda_graph``: the whole training step (forward, backward, clipping, AdamW) captured
once per batch shape as one CUDA graph and replayed.

On a GPU a small encoder's step is launch-bound: MiniLM at batch 16 launches ~600 kernels a step
(~24 ms on an H200) for ~1 ms of arithmetic; the same step replayed as one graph took 2.3 ms.
A graph replays fixed addresses, so:

- batches come in a few fixed (rows, width) shapes, packed on the host (``shapes``); each shape's
  static input buffers are filled by ``copy_`` and its graph replayed;
- the gradients are tensors of our own, kept across steps (the Trainer's ``zero_grad`` sets
  ``.grad`` to None; the step points it back and zeroes them inside the graph);
- AdamW is fused and ``capturable`` with its lr a device tensor per group, which the Trainer's
  schedule ``fill_``s before each step; clipping (``foreach``) runs inside the step;
- nothing in the step reads a value back to the host (the loss and the gradient norm stay device
  tensors; the Trainer reads them at logging), and dropout draws its masks from the CUDA
  generator, whose offset a graph advances at every replay.

Each shape's first batch trains eagerly (on a side stream: it also creates the optimizer's
state and warms cuBLAS), then the step is captured for the next batches of that shape. A change
in the trainable set (``gradual`` unfreezes a block at each epoch start) drops the graphs: they
are captured again for the new set, a few captures per epoch.

Inside the HF Trainer (``GraphMixin``): its ``training_step`` runs the step, the optimizer step
and clipping included, so the Trainer's own clipping (``max_grad_norm=0`` in its arguments) and
``optimizer.step`` (a no-op on the instance, the class's step kept for the graph) stand aside.
``Replay`` stands in for the graph on a CPU (the tests): the same buffers, copies and step, run
again at each replay.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainingArguments

from ablate.models import anatomy
from ablate.plugins import Context, Plugin
from ablate.speed.grouping import packing_unsupported
from ablate.speed.shapes import FixedShapeCollator, Shapes, shape_of

log = logging.getLogger(__name__)

# The Trainer's clipping, which the step takes over (its TrainingArguments default)
MAX_GRAD_NORM = TrainingArguments.__dataclass_fields__["max_grad_norm"].default


class Replay:
    """A stand-in for CUDA graphs: ``capture`` records nothing and each replay runs the step
    again, on the same static buffers."""

    captures = 0

    def warmup(self, step: Callable[[], tuple]) -> tuple:
        return step()

    def capture(self, step: Callable[[], tuple]) -> Callable[[], tuple]:
        self.captures += 1
        return step


class CudaGraphs:
    """Captures with ``torch.cuda.graph``, every graph in one memory pool (a replay's
    intermediates do not outlive it, and replays never overlap)."""

    captures = 0

    def __init__(self):
        self.stream = torch.cuda.Stream()
        self.pool = None

    def warmup(self, step: Callable[[], tuple]) -> tuple:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = step()
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def capture(self, step: Callable[[], tuple]) -> Callable[[], tuple]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()
        self.pool = self.pool or graph.pool()
        self.captures += 1

        def replay() -> tuple:
            graph.replay()
            return out

        return replay


def capturable(optimizer: torch.optim.Optimizer, device: torch.device) -> Callable[[], None]:
    """Make ``optimizer`` (a torch AdamW) fused with its lr a tensor on ``device`` per group, and
    capturable on CUDA; the Trainer's ``optimizer.step`` becomes a no-op on the instance (the
    graph steps it). Returns the class's step, bound: what the graph calls."""
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
        group["fused"], group["foreach"] = True, False
        group["capturable"] = device.type == "cuda"  # torch allows it on accelerators only
    step = type(optimizer).step.__get__(optimizer)
    # a bound method, as torch's LR schedulers wrap the step they find (``__func__``)
    optimizer.step = types.MethodType(_stands_aside, optimizer)
    return step


def _stands_aside(optimizer, *args, **kwargs) -> None:
    """The Trainer's optimizer step: the graph took it."""


class GraphedStep:
    """The training step, captured once per batch shape and replayed (``backend``: ``CudaGraphs``
    or ``Replay``). ``__call__`` returns the batch's loss, a device tensor; ``norm``, the last
    step's gradient norm before clipping, also on the device."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        step: Callable[[], None],
        max_norm: float,
        backend,
        autocast: Callable | None = None,
    ):
        self.model, self.optimizer, self.optimizer_step = model, optimizer, step
        self.max_norm, self.backend = max_norm, backend
        self.autocast = autocast
        self.graphs: dict[tuple, tuple[dict, Callable[[], tuple]]] = {}
        self.params: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.recaptures = 0  # times a change of the trainable set dropped the graphs
        self.norm: torch.Tensor | None = None

    def _trainable(self) -> list[torch.Tensor]:
        groups = self.optimizer.param_groups
        return [p for g in groups for p in g["params"] if p.requires_grad]

    def _hold_grads(self) -> None:
        params = self._trainable()
        if [id(p) for p in params] != [id(p) for p in self.params]:
            if self.params:
                self.recaptures += 1
                log.info("cuda_graph: the trainable parameters changed; capturing again")
            self.graphs.clear()
            self.params = params
            self.grads = [torch.zeros_like(p) for p in params]
        for p, g in zip(self.params, self.grads, strict=True):
            p.grad = g

    def step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on ``batch``, as captured: gradients zeroed, forward, backward, the norm
        clipped, AdamW; (loss, gradient norm) as device tensors."""
        torch._foreach_zero_(self.grads)
        if self.autocast is not None:
            with self.autocast():
                loss = self.model(**batch).loss
        else:
            loss = self.model(**batch).loss
        loss.backward()
        limit = self.max_norm if self.max_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, limit, foreach=True)
        self.optimizer_step()
        return loss.detach(), norm.detach()

    def __call__(self, batch: dict) -> torch.Tensor:
        self._hold_grads()
        key = shape_of(batch)
        entry = self.graphs.get(key)
        if entry is None:
            static = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
            loss, self.norm = self.backend.warmup(lambda: self.step(static))
            self.graphs[key] = (static, self.backend.capture(lambda: self.step(static)))
            return loss
        static, replay = entry
        for name, value in batch.items():
            if torch.is_tensor(value):
                static[name].copy_(value, non_blocking=True)
        loss, self.norm = replay()
        return loss


class GraphMixin:
    """Trainer mixin: ``training_step`` runs ``graphed`` (made at ``create_optimizer``, once the
    plugin's ``attach`` has set the backend); the training loader collates with
    ``fixed_collator`` (fixed shapes), evaluation with the plain collator."""

    graph_backend = None  # CudaGraphs() or Replay(): set by the plugin
    graph_max_norm = MAX_GRAD_NORM
    fixed_collator = None
    graphed: GraphedStep | None = None

    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        if self.graph_backend is not None and self.graphed is None:
            step = capturable(optimizer, self.args.device)
            autocast = None
            if self.args.bf16:  # a graph's casts are not cached across replays
                device = self.args.device.type

                def autocast():
                    return torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False)

            self.graphed = GraphedStep(
                self.model, optimizer, step, self.graph_max_norm, self.graph_backend, autocast
            )
        return optimizer

    def get_train_dataloader(self):
        if self.fixed_collator is None:
            return super().get_train_dataloader()
        plain, self.data_collator = self.data_collator, self.fixed_collator
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = plain

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.graphed is None:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()
        return self.graphed(self._prepare_inputs(inputs))

    def _get_grad_norm(self, model, grad_norm=None):
        # the step's own norm (a device tensor, read at logging): the Trainer's would run another
        # norm over every gradient each step
        if self.graphed is not None and self.graphed.norm is not None:
            return self.graphed.norm
        return super()._get_grad_norm(model, grad_norm)


def why_eager(ctx: Context) -> str | None:
    """Why this run's step cannot be captured (None: it can), with ``trainer.cuda_graph`` on."""
    if ctx.device != "cuda":
        return "no GPU (a CUDA graph needs one)"
    if (why := packing_unsupported(ctx.model)) is not None:
        return f"its batches cannot be packed into fixed shapes: {why}"
    if ctx.applied.eager_steps:
        return ctx.applied.eager_steps
    if ctx.value("trainer.cache_frozen"):
        return "trainer.cache_frozen's batches carry per-window inputs"
    if ctx.value("trainer.compile") != "off":
        return "trainer.compile is on (reduce-overhead captures graphs of its own)"
    return None


class CudaGraph(Plugin):
    name = "cuda_graph"
    switches = ("trainer.cuda_graph",)

    why: str | None = "off"
    collator: FixedShapeCollator | None = None

    def arguments(self, ctx: Context) -> dict[str, Any]:
        self.why = why_eager(ctx) if ctx.value("trainer.cuda_graph") else "off"
        if self.why is not None:
            return {}
        # clipping runs inside the step; the per-step NaN check would read the loss every step
        return {"max_grad_norm": 0.0, "logging_nan_inf_filter": False}

    def prepare(self, ctx: Context) -> dict[str, str]:
        if self.why == "off":
            return {"cuda_graph": "off"}
        if self.why is not None:
            log.info("trainer.cuda_graph: not applied: %s; the step trains eagerly", self.why)
            return {"cuda_graph": f"not applied: {self.why}"}
        attention = anatomy.unwrap(ctx.model).config._attn_implementation
        shapes = Shapes.for_batches(ctx.cfg.trainer.batch_size, ctx.cfg.data.max_length)
        self.collator = FixedShapeCollator(ctx.collator, shapes, attention)
        ctx.mixins.append(GraphMixin)
        return {
            "cuda_graph": f"the whole step captured per batch shape (rows {shapes.rows} x "
            f"widths {shapes.widths})"
        }

    def attach(self, ctx: Context, trainer) -> dict[str, str]:
        if self.why is not None:
            return {}
        trainer.graph_backend = CudaGraphs()
        trainer.graph_max_norm = MAX_GRAD_NORM
        trainer.fixed_collator = self.collator
        stats = getattr(trainer.data_collator, "stats", None)
        if stats is not None:  # the meter counts the packed rows the step computes
            stats.by_trainer = True
            self.collator.stats = stats
        return {}
