"""Freezing strategies: functions that decide which parameters train, and how (``conf/freeze``).

A strategy takes the built model and the ``freeze`` config, sets ``requires_grad`` (wrapping the
model when it adds parameters, as LoRA does) and returns an ``Applied``: the model to train and the
resulting counts, plus what the training loop needs without knowing the strategy: optimiser
parameter groups, Trainer callbacks and artifact writers. New strategies register in
``STRATEGIES`` and name the ``freeze`` keys they read in ``STRATEGY_KEYS``. The head always trains.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from omegaconf import DictConfig, ListConfig, OmegaConf
from torch import nn
from transformers import TrainerCallback

from ablate import model as model_lib
from ablate.config import FreezeConfig
from ablate.errors import AblateError

if TYPE_CHECKING:
    import torch
    from transformers import Trainer

    from ablate.tracking import Run


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
    ``callbacks``: factories called with the run, giving Trainer callbacks.
    ``artifacts``: artifact folder -> function that writes that folder's files into a directory.
    """

    trainable_params: int
    total_params: int
    frozen_blocks: list[int] = field(default_factory=list)
    embeddings_frozen: bool = False
    model: nn.Module | None = None  # the input model, or the wrapper a strategy put around it
    param_groups: list[ParamGroup] | None = None
    callbacks: list[Callable[[Run], TrainerCallback]] = field(default_factory=list)
    artifacts: dict[str, Callable[[str], None]] = field(default_factory=dict)

    @property
    def trainable_pct(self) -> float:
        return 100.0 * self.trainable_params / self.total_params


def describe(model: nn.Module, **hooks) -> Applied:
    """Counts and fully frozen parts of ``model`` as its ``requires_grad`` flags now stand."""
    frozen = [
        i
        for i, block in enumerate(model_lib.blocks(model))
        if not any(p.requires_grad for p in block.parameters())
    ]
    emb_frozen = not any(p.requires_grad for p in model_lib.embeddings(model).parameters())
    trainable, total = model_lib.count_params(model)
    return Applied(trainable, total, frozen, emb_frozen, model=model, **hooks)


def _train_everything(model: nn.Module) -> None:
    # Strategies start from a clean slate, so applying one to a reused model is deterministic.
    for p in model.parameters():
        p.requires_grad = True


def frozen_block_indices(cfg: DictConfig, n_blocks: int) -> list[int]:
    """The union of the block selectors in ``cfg``, checked against the model's ``n_blocks``."""
    for key in ("first", "last", "every"):
        value = cfg[key]
        if value < 0 or value > n_blocks or (key == "every" and value > 0 and n_blocks == 0):
            raise AblateError(f"freeze.{key}={value}: must be between 0 and {n_blocks} (blocks)")
    bad = [i for i in cfg.layers if not 0 <= i < n_blocks]
    if bad:
        raise AblateError(
            f"freeze.layers: block(s) {bad} do not exist; the model has {n_blocks} blocks "
            f"(0..{n_blocks - 1})"
        )
    chosen = set(cfg.layers)
    if cfg.all:
        chosen.update(range(n_blocks))
    chosen.update(range(cfg.first))
    chosen.update(range(n_blocks - cfg.last, n_blocks))
    if cfg.every:
        chosen.update(range(0, n_blocks, cfg.every))
    return sorted(chosen)


def freeze_layers(model: nn.Module, cfg: DictConfig) -> Applied:
    """Freeze whole transformer blocks (and optionally the embeddings); everything else trains."""
    blocks = model_lib.blocks(model)
    frozen = frozen_block_indices(cfg, len(blocks))
    _train_everything(model)
    for i in frozen:
        blocks[i].requires_grad_(False)
    if cfg.embeddings:
        model_lib.embeddings(model).requires_grad_(False)
    return describe(model)


def freeze_bitfit(model: nn.Module, cfg: DictConfig) -> Applied:
    """BitFit: of the encoder only the bias terms (LayerNorm's included) train; the head (with
    BERT's pooler, ``model.pooler``) trains."""
    _train_everything(model)
    pooler = model_lib.pooler(model)
    head = {id(p) for p in pooler.parameters()} if pooler is not None else set()
    n_bias = 0
    for name, p in model_lib.encoder(model).named_parameters():
        if id(p) not in head:  # the pooler is part of the head (model.pooler)
            p.requires_grad = name.rsplit(".", 1)[-1] == "bias"
            n_bias += p.requires_grad
    if not n_bias:
        raise AblateError(
            f"freeze.strategy=bitfit: {type(model).__name__}'s encoder has no bias terms to train"
        )
    return describe(model)


def freeze_llrd(model: nn.Module, cfg: DictConfig) -> Applied:
    """Layer-wise lr decay: block i of n gets lr x decay^(n-1-i), the embeddings lr x decay^n.

    The head and the top block train at the full lr. The layer selectors still apply (default:
    nothing frozen), so ``freeze.first=2`` with llrd freezes blocks 0-1 and decays the rest.
    """
    if not 0 < cfg.decay <= 1:
        raise AblateError(f"freeze.decay={cfg.decay}: must be in (0, 1] (1 = no decay)")
    freeze_layers(model, cfg)
    blocks = model_lib.blocks(model)
    n = len(blocks)
    parts = {f"block{i}": (blocks[i], cfg.decay ** (n - 1 - i)) for i in reversed(range(n))}
    parts["embeddings"] = (model_lib.embeddings(model), cfg.decay**n)
    owner = {id(p): name for name, (module, _) in parts.items() for p in module.parameters()}
    # The head's group first, then top to bottom: the Trainer logs the first group's lr.
    names: dict[str, list[str]] = {"head": [], **{name: [] for name in parts}}
    for pname, p in model.named_parameters():
        if p.requires_grad:
            names[owner.get(id(p), "head")].append(pname)
    scale = {"head": 1.0, **{name: s for name, (_, s) in parts.items()}}
    groups = [ParamGroup(name, params, scale[name]) for name, params in names.items() if params]
    return describe(model, param_groups=groups)


class GradualUnfreezing(TrainerCallback):
    """Trainer callback: at the start of epoch e, the top ``schedule[e]`` blocks train.

    ``schedule`` holds one count per epoch (the last holds for later epochs); ``n_blocks + 1``
    unfreezes the whole encoder, embeddings included. The head always trains. Each epoch's
    trainable count is logged with step = epoch (1..N).
    """

    def __init__(self, model: nn.Module, schedule: Sequence[int]):
        self.model = model
        self.schedule = list(schedule)
        self.run: Run | None = None

    def with_run(self, run: Run) -> GradualUnfreezing:
        self.run = run
        return self

    def set_epoch(self, epoch: int) -> int:
        """Apply the schedule of 0-based ``epoch``; returns the number of top blocks training."""
        blocks = model_lib.blocks(self.model)
        k = self.schedule[min(epoch, len(self.schedule) - 1)]
        model_lib.encoder(self.model).requires_grad_(k > len(blocks))
        for i, block in enumerate(blocks):
            block.requires_grad_(i >= len(blocks) - k)
        pooler = model_lib.pooler(self.model)
        if pooler is not None:  # part of the head (model.pooler), which always trains
            pooler.requires_grad_(True)
        return k

    def on_epoch_begin(self, args, state, control, **kwargs):
        epoch = int(round(state.epoch or 0))  # epochs done: a resumed run starts past 0
        self.set_epoch(epoch)
        if self.run is not None:
            trainable, total = model_lib.count_params(self.model)
            self.run.metrics(
                {"trainable_params": trainable, "trainable_pct": 100.0 * trainable / total},
                step=epoch + 1,
            )


def freeze_gradual(model: nn.Module, cfg: DictConfig) -> Applied:
    """Gradual unfreezing: the head first, then one more block from the top per epoch.

    The optimiser holds every parameter from the start (frozen ones simply get no gradient), so
    blocks unfrozen later train.
    """
    n = len(model_lib.blocks(model))
    schedule = list(range(n + 2)) if cfg.schedule is None else list(cfg.schedule)
    bad = [k for k in schedule if not 0 <= k <= n + 1]
    if not schedule or bad or schedule != sorted(schedule):
        raise AblateError(
            f"freeze.schedule={schedule}: must be a non-empty, non-decreasing list of top-block "
            f"counts per epoch, each between 0 and {n + 1} ({n} blocks; {n + 1} = also the "
            f"embeddings)"
        )
    _train_everything(model)
    unfreezing = GradualUnfreezing(model, schedule)
    unfreezing.set_epoch(0)
    everything = ParamGroup("all", [name for name, _ in model.named_parameters()])
    return describe(model, param_groups=[everything], callbacks=[unfreezing.with_run])


# Per architecture (``config.model_type``); others fall back to peft's own table.
LORA_TARGETS: dict[str, list[str]] = {
    **dict.fromkeys(
        ("bert", "roberta", "xlm-roberta", "electra", "camembert", "mpnet"), ["query", "value"]
    ),
    "distilbert": ["q_lin", "v_lin"],
    "deberta-v2": ["query_proj", "value_proj"],
}


def lora_targets(model: nn.Module, cfg: DictConfig) -> list[str]:
    """``freeze.target_modules``, or the architecture's default; each must name encoder Linears."""
    encoder = model_lib.encoder(model)
    linear = sorted(
        {name.rsplit(".", 1)[-1] for name, m in encoder.named_modules() if isinstance(m, nn.Linear)}
    )
    if cfg.target_modules is not None:
        targets = list(cfg.target_modules)
    else:
        from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

        model_type = getattr(model.config, "model_type", None)
        targets = LORA_TARGETS.get(model_type) or PEFT_TARGETS.get(model_type)
        if not targets:
            raise AblateError(
                f"freeze.target_modules: no default for model type {model_type!r}; set it to some "
                f"of the encoder's Linear layers: {', '.join(linear)}"
            )
    unknown = [t for t in targets if t not in linear]
    if not targets or unknown:
        raise AblateError(
            f"freeze.target_modules={targets}: {unknown or 'empty'}; allowed: the encoder's "
            f"Linear layers {', '.join(linear)}"
        )
    return list(targets)


def _peft_task_type(model: nn.Module):
    from peft import TaskType

    name = type(model).__name__
    if name.endswith("ForTokenClassification") or isinstance(
        model, model_lib.BiLSTMTokenClassifier
    ):
        return TaskType.TOKEN_CLS
    if name.endswith("ForSequenceClassification"):
        return TaskType.SEQ_CLS
    return None


def freeze_lora(model: nn.Module, cfg: DictConfig) -> Applied:
    """LoRA (peft): the encoder is frozen; rank-``r`` adapters on ``target_modules`` and the head
    train. The run's artifact ``adapter/`` holds the adapter and head only (``save_pretrained``).
    """
    from peft import LoraConfig, get_peft_model

    if cfg.r < 1:
        raise AblateError(f"freeze.r={cfg.r}: the LoRA rank must be a positive integer")
    if cfg.alpha <= 0:
        raise AblateError(f"freeze.alpha={cfg.alpha}: the LoRA scaling alpha must be positive")
    if not 0 <= cfg.dropout < 1:
        raise AblateError(f"freeze.dropout={cfg.dropout}: must be in [0, 1)")
    targets = lora_targets(model, cfg)
    _train_everything(model)
    lora = LoraConfig(
        task_type=_peft_task_type(model),
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        # The whole head trains and is saved with the adapter (for the linear head peft's
        # token-classification default would pick the classifier anyway; not the BiLSTM, nor
        # BERT's pooler under a sentence head).
        modules_to_save=model_lib.head_modules(model),
    )
    with warnings.catch_warnings():
        # peft 0.21 calls a transformers 5 method that is deprecated; nothing for users to fix.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        wrapped = get_peft_model(model, lora)
    return describe(wrapped, artifacts={"adapter": wrapped.save_pretrained})


STRATEGIES: dict[str, Callable[[nn.Module, DictConfig], Applied]] = {
    "layers": freeze_layers,
    "bitfit": freeze_bitfit,
    "llrd": freeze_llrd,
    "gradual": freeze_gradual,
    "lora": freeze_lora,
}

_SELECTORS = ("all", "first", "last", "every", "layers", "embeddings")
# The ``freeze`` keys each strategy reads; any other key set away from its default is an error.
STRATEGY_KEYS: dict[str, tuple[str, ...]] = {
    "layers": _SELECTORS,
    "bitfit": (),
    "llrd": (*_SELECTORS, "decay"),
    "gradual": ("schedule",),
    "lora": ("r", "alpha", "dropout", "target_modules"),
}


def _check_keys(cfg: DictConfig) -> None:
    used = STRATEGY_KEYS.get(cfg.strategy)
    if used is None:
        return
    defaults = FreezeConfig()
    for f in dataclasses.fields(FreezeConfig):
        if f.name in ("name", "strategy", *used) or f.name not in cfg:
            continue
        value = cfg[f.name]
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value)
        if value != getattr(defaults, f.name):
            raise AblateError(
                f"freeze.{f.name}={value} has no effect with freeze.strategy={cfg.strategy} "
                f"(its keys: {', '.join(used) or 'none'})"
            )


def apply(model: nn.Module, cfg: DictConfig) -> Applied:
    """Run the strategy named by ``freeze.strategy`` on ``model``; train ``Applied.model``."""
    if cfg.strategy not in STRATEGIES:
        raise AblateError(
            f"freeze.strategy={cfg.strategy!r} is not one of {', '.join(sorted(STRATEGIES))}"
        )
    _check_keys(cfg)
    applied = STRATEGIES[cfg.strategy](model, cfg)
    if applied.model is None:
        applied.model = model
    return applied


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
