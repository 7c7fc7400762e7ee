"""Frozen-prefix caching (``trainer.cache_frozen``): compute a frozen bottom of the encoder once.

When the embeddings and blocks 0..k-1 are frozen, their output for a training window never
changes. It is computed once (batched, in eval mode, without autograd) and stored for every
training window; training then runs only blocks k.. and the head on it, so neither the forward
nor any backward pass goes through the frozen prefix.

Effect on results: the prefix runs in eval mode, so it has no dropout; an uncached run of the
same strategy applies dropout in the frozen layers too (they are frozen, not in eval mode). The
two runs therefore differ by more than float noise, which is why the switch is off by default.
In eval mode the cached model computes the same logits as the full model (tested). Test
windows are evaluated with the full model (a normal forward), as without caching.

``trainer.cache_frozen_eval`` (on by default) does the same for the dev windows, which are
evaluated after every epoch: each window's prefix output is computed in its first evaluation
(the same forward as the full model's) and kept, so later evaluations run only blocks k.. and
the head. Evaluation has no dropout, so this changes no result (tested); it applies wherever the
prefix is frozen, with or without ``trainer.cache_frozen``.

Checkpoints of a ``PrefixCached`` model hold the wrapped model's state dict (its keys, not
``model.``-prefixed) and config, so a run resumes whether or not a cache applies this time.

Valid only where nothing below block k trains: ``freeze.embeddings=true`` with ``first`` (or
``all``, or ``layers`` starting at 0), strategy ``layers``, no adapters; elsewhere the run goes on
without the cache and says why (tag ``speed.cache_frozen``). Works for encoders whose base model
calls ``embeddings`` and then iterates over its block list (BERT family, DistilBERT); any other
is caught by a check of the cached forward against the full one before training.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.speed import batching

log = logging.getLogger(__name__)

ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass
class PrefixStore:
    """Hidden states after the frozen prefix for every window, real tokens only, concatenated."""

    hidden: torch.Tensor  # (total tokens + 1, hidden size); the last row is zeros, for padding
    offsets: torch.Tensor  # (windows,) start row of each window
    lengths: torch.Tensor  # (windows,)
    filled: torch.Tensor  # (windows,) which windows hold their output yet

    @classmethod
    def empty(cls, lengths: Sequence[int], hidden_size: int, device) -> PrefixStore:
        """A store for windows of ``lengths`` with no output in it yet."""
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        offsets = torch.zeros_like(lengths)
        offsets[1:] = torch.cumsum(lengths, 0)[:-1]
        return cls(
            hidden=torch.zeros(int(lengths.sum()) + 1, hidden_size, device=device),
            offsets=offsets.to(device),
            lengths=lengths.to(device),
            filled=torch.zeros(len(lengths), dtype=torch.bool, device=device),
        )

    def to(self, device) -> PrefixStore:
        """This store on ``device``."""
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)}
        )

    @property
    def nbytes(self) -> int:
        return self.hidden.numel() * self.hidden.element_size()

    def fill(self, index, out: torch.Tensor) -> None:
        """Store row j of ``out`` (B, L, hidden), real tokens only, as window ``index[j]``'s."""
        index = torch.as_tensor(index, device=self.offsets.device)
        pos = torch.arange(out.size(1), device=self.offsets.device)
        real = pos < self.lengths[index, None]
        rows = self.offsets[index, None] + pos
        self.hidden[rows[real]] = out[real.to(out.device)].to(self.hidden)
        self.filled[index] = True

    def batch(self, index: torch.Tensor, length: int) -> torch.Tensor:
        """(B, length, hidden) for windows ``index``, zero-padded on the right."""
        index = index.to(self.offsets.device)
        pos = torch.arange(length, device=self.offsets.device)
        rows = self.offsets[index, None] + pos
        rows = torch.where(pos < self.lengths[index, None], rows, self.hidden.size(0) - 1)
        return self.hidden[rows]


def _parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    base = anatomy.encoder(model)
    embeddings = getattr(base, "embeddings", None)
    if not isinstance(embeddings, nn.Module):
        raise AblateError(
            f"trainer.cache_frozen: {type(base).__name__} has no `embeddings` module to replace"
        )
    return base, anatomy.blocks(model), embeddings


class _Feed(nn.Module):
    """Stands in for the embeddings: returns the cached hidden states, whatever it is given."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.hidden


@contextmanager
def _swapped(model: nn.Module, k: int, hidden: torch.Tensor | None) -> Iterator[None]:
    """Blocks 0..k-1 only (``hidden`` None: the prefix), or the cache fed into blocks k.. ."""
    base, blocks, embeddings = _parts(model)
    block_owner, block_name = anatomy.owner(base, blocks)
    emb_owner, emb_name = anatomy.owner(base, embeddings)
    setattr(block_owner, block_name, blocks[:k] if hidden is None else blocks[k:])
    if hidden is not None:
        setattr(emb_owner, emb_name, _Feed(hidden))
    try:
        yield
    finally:
        setattr(block_owner, block_name, blocks)
        setattr(emb_owner, emb_name, embeddings)


def frozen_prefix(applied) -> tuple[int, str | None]:
    """(k, None) when the embeddings and blocks 0..k-1 (k >= 1) are frozen and nothing else
    below block k trains; else (0, why not)."""
    model = applied.model
    if anatomy.unwrap(model) is not model:
        return 0, "adapter models (LoRA) train inside every block"
    if applied.callbacks:
        return 0, "the strategy changes what trains during training"
    if applied.param_groups is not None:
        return 0, "the strategy builds its own optimiser groups"
    if not applied.embeddings_frozen:
        return 0, "embedding parameters train (layer strategies: freeze.embeddings=true)"
    frozen = set(applied.frozen_blocks)
    k = 0
    while k in frozen:
        k += 1
    if k == 0:
        return 0, "block 0 trains"
    try:
        base, blocks, _ = _parts(model)
    except AblateError as exc:
        return 0, str(exc)
    pooler = anatomy.pooler(model)  # part of the head, above the blocks
    above = [*blocks[k:], *([pooler] if pooler is not None else [])]
    suffix = {id(p) for module in above for p in module.parameters()}
    stray = [name for name, p in base.named_parameters() if p.requires_grad and id(p) not in suffix]
    if stray:
        return 0, f"encoder parameters below block {k} train: {', '.join(stray[:3])}"
    return k, None


def _pad(features: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    length = max(len(f["input_ids"]) for f in features)
    batch = {}
    for key in ENCODER_INPUTS:
        if key not in features[0]:
            continue
        fill = pad_id if key == "input_ids" else 0
        batch[key] = torch.tensor(
            [list(f[key]) + [fill] * (length - len(f[key])) for f in features]
        )
    return batch


# no_grad, not inference_mode: the store feeds training, and inference tensors cannot be saved for
# backward.
@torch.no_grad()
def compute(
    model: nn.Module, k: int, features: Sequence[dict], batch_size: int, pad_id: int = 0
) -> PrefixStore:
    """Run the embeddings and blocks 0..k-1 in eval mode over every window, in length order
    (``batching.length_batches``: at most ``batch_size`` windows a batch)."""
    device = next(model.parameters()).device
    lengths = [len(f["input_ids"]) for f in features]
    store = PrefixStore.empty(lengths, model.config.hidden_size, device)
    batches = batching.length_batches(lengths, batch_size, batching.sub_batch_cost(model))
    was_training = model.training
    model.eval()
    try:
        for rows in batches:
            batch = {
                key: v.to(device) for key, v in _pad([features[i] for i in rows], pad_id).items()
            }
            store.fill(rows, _prefix_output(model, k, batch))
    finally:
        model.train(was_training)
    return store


def _prefix_output(model: nn.Module, k: int, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, L, hidden): the embeddings and blocks 0..k-1 on ``batch``'s encoder inputs."""
    with _swapped(model, k, None):
        return anatomy.encoder(model)(**batch)[0]


class PrefixCached(nn.Module):
    """The task model on cached prefix outputs; a normal model without an index.

    ``forward(input_ids, attention_mask, labels, prefix_index)`` looks the training windows'
    prefix output up in ``store`` and runs blocks k.. and the head on it (``prefix_hidden``: that
    output given, as a packed batch gives it). ``eval_index`` (eval mode) does the same for dev
    windows from ``eval_store``, computing the output of windows it does not hold yet. Without
    any (test) it is the full model's forward.
    """

    main_input_name = "input_ids"

    def __init__(
        self,
        model: nn.Module,
        k: int,
        store: PrefixStore | None,
        eval_store: PrefixStore | None = None,
    ):
        super().__init__()
        self.model = model
        self.k = k
        self.store = store  # training windows; None: training runs the full model
        self.eval_store = eval_store
        self.config = model.config  # the Trainer reads it
        if hasattr(model, "accepts_loss_kwargs"):
            self.accepts_loss_kwargs = model.accepts_loss_kwargs
        else:  # the Trainer's own rule, applied to the wrapped model rather than this wrapper
            params = inspect.signature(model.forward).parameters.values()
            self.accepts_loss_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)

    @property
    def base_model(self) -> nn.Module:
        return anatomy.encoder(self.model)

    def get_base_model(self) -> nn.Module:
        """The task model under this wrapper (as peft's wrappers answer ``anatomy.unwrap``)."""
        return anatomy.unwrap(self.model)

    @property
    def first_trained_block(self) -> int:
        """The first block a training step runs: k on the training cache, else 0."""
        return self.k if self.store is not None else 0

    def per_token_inputs(self, inputs: dict) -> dict:
        """``inputs`` with the training windows' cached hidden states in place of their index,
        so that they can be packed like any per-token input."""
        if inputs.get("prefix_index") is None:
            return inputs
        out = {k: v for k, v in inputs.items() if k != "prefix_index"}
        out["prefix_hidden"] = self.training_prefix(inputs["prefix_index"], inputs["input_ids"])
        return out

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    # Checkpoints hold the wrapped model's keys (no ``model.`` prefix), as an unwrapped run of the
    # same config writes them: a killed run resumes whether or not the caches apply this time.
    _keys_to_ignore_on_save = None  # the Trainer reads it after loading a checkpoint

    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        labels=None,
        prefix_index=None,
        prefix_hidden=None,
        eval_index=None,
        **kw,
    ):
        if prefix_index is not None:
            prefix_hidden = self.training_prefix(prefix_index, input_ids)
        elif eval_index is not None and self.eval_store is not None and not self.training:
            prefix_hidden = self._eval_prefix(eval_index, input_ids, attention_mask, kw)
        if prefix_hidden is None:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kw
            )
        with _swapped(self.model, self.k, prefix_hidden.to(input_ids.device)):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kw
            )

    def _store_on(self, name: str, device: torch.device) -> PrefixStore:
        """Store ``name`` ("store", "eval_store") on ``device``: both are made before the Trainer
        moves the model, so the first batch moves them."""
        store = getattr(self, name)
        if store.hidden.device != device:
            store = store.to(device)
            setattr(self, name, store)
        return store

    def training_prefix(self, index: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L, hidden): the stored prefix output of training windows ``index``."""
        return self._store_on("store", input_ids.device).batch(index, input_ids.size(1))

    def _eval_prefix(self, index, input_ids, attention_mask, kw) -> torch.Tensor:
        store = self._store_on("eval_store", input_ids.device)
        index = index.to(input_ids.device)
        missing = ~store.filled[index]
        if missing.any():  # a first evaluation: the prefix runs on those rows, as in the full model
            batch = {"input_ids": input_ids, "attention_mask": attention_mask}
            if kw.get("token_type_ids") is not None:
                batch["token_type_ids"] = kw["token_type_ids"]
            with torch.no_grad():  # frozen; the store must not join a graph
                out = _prefix_output(self.model, self.k, {k: v[missing] for k, v in batch.items()})
            store.fill(index[missing], out)
        return store.batch(index, input_ids.size(1))


def _logits(out) -> torch.Tensor:
    return out["logits"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]


@torch.inference_mode()
def check(
    wrapped: PrefixCached,
    features: Sequence[dict],
    pad_id: int = 0,
    n: int = 4,
    index_key: str = "prefix_index",
) -> float:
    """Max |logits difference| between the cached and the full forward (eval mode), on the first
    ``n`` windows of ``features`` (``index_key``: training or dev windows)."""
    was_training = wrapped.training
    wrapped.eval()
    try:
        batch = _pad(features[:n], pad_id)
        device = next(wrapped.parameters()).device
        batch = {key: v.to(device) for key, v in batch.items()}
        index = torch.arange(min(n, len(features)))
        cached = _logits(wrapped(**batch, **{index_key: index}))
        full = _logits(wrapped(**batch))
        mask = batch["attention_mask"].bool() if cached.dim() == 3 else slice(None)
        return float((cached[mask] - full[mask]).abs().max())
    finally:
        wrapped.train(was_training)
