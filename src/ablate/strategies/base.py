"""What every strategy shares: the ``Applied`` result the training loop reads, parameter groups,
counting what trains, and the optimiser over a strategy's groups."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn
from transformers import TrainerCallback

from ablate.errors import AblateError
from ablate.models import anatomy

if TYPE_CHECKING:
    import torch
    from transformers import Trainer


@dataclass
class ParamGroup:
    """Parameters (named as in ``Applied.model``) that share a learning-rate multiplier."""

    name: str
    params: list[str]
    lr_scale: float = 1.0


@dataclass
class Applied:
    """What a strategy did: the model to train, its parameter counts, and hooks for training.

    ``param_groups``: None keeps the Trainer's own optimiser groups (the parameters that require
    grad); otherwise the optimiser is built over exactly these (``build_optimizer``).
    ``callbacks``: factories called with the run's recorder, giving Trainer callbacks.
    ``artifacts``: artifact folder -> function that writes that folder's files into a directory.
    ``eager_only``: why the model trains eagerly even under ``trainer.compile`` (None: compiled).
    ``eager_steps``: why its step cannot be captured under ``trainer.cuda_graph`` (a callback
    that acts between steps; None: it can).
    """

    trainable_params: int
    total_params: int
    frozen_blocks: list[int] = field(default_factory=list)
    embeddings_frozen: bool = False
    model: nn.Module | None = None  # the input model, or the wrapper a strategy put around it
    param_groups: list[ParamGroup] | None = None
    callbacks: list[Callable[[Any], TrainerCallback]] = field(default_factory=list)
    artifacts: dict[str, Callable[[str], None]] = field(default_factory=dict)
    eager_only: str | None = None
    eager_steps: str | None = None

    @property
    def trainable_pct(self) -> float:
        return 100.0 * self.trainable_params / self.total_params


def describe(model: nn.Module, **hooks) -> Applied:
    """Counts and fully frozen parts of ``model`` as its ``requires_grad`` flags now stand."""
    frozen = [
        i
        for i, block in enumerate(anatomy.blocks(model))
        if not any(p.requires_grad for p in block.parameters())
    ]
    emb_frozen = not any(p.requires_grad for p in anatomy.embeddings(model).parameters())
    trainable, total = anatomy.count_params(model)
    return Applied(trainable, total, frozen, emb_frozen, model=model, **hooks)


def train_everything(model: nn.Module) -> None:
    """Every parameter trainable: strategies start from a clean slate, so applying one to a
    reused model is deterministic."""
    for p in model.parameters():
        p.requires_grad = True


def build_optimizer(trainer: Trainer, groups: Sequence[ParamGroup]) -> torch.optim.Optimizer:
    """The Trainer's optimiser over a strategy's groups: its class, betas/eps and no-decay rule
    (biases and norms get no weight decay), with each group's lr = ``learning_rate x lr_scale``.
    """
    model, args = trainer.model, trainer.args
    named = dict(model.named_parameters())
    decay = set(trainer.get_decay_parameter_names(model))
    torch_groups = []
    for group in groups:
        for decayed in (True, False):
            params = [named[n] for n in group.params if (n in decay) == decayed]
            if params:
                torch_groups.append(
                    {
                        "params": params,
                        "lr": args.learning_rate * group.lr_scale,
                        "weight_decay": args.weight_decay if decayed else 0.0,
                        "group": group.name,  # kept by torch; names the group for readers
                    }
                )
    cls, kwargs = trainer.get_optimizer_cls_and_kwargs(args, model)
    if {"params", "model", "optimizer_dict"} & set(kwargs):
        raise AblateError(f"trainer optim {args.optim!r} builds its own parameter groups")
    return cls(torch_groups, **kwargs)
