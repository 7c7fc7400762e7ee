"""What training changed in a model built from pretrained weights, and that model rebuilt from
them: a kept model's ``delta`` layout (``ablate.training.keep``).

A tensor equal to the pretrained one is left out. One whose rows mostly equal the pretrained rows,
or the pretrained rows times one scale, keeps the other rows, their indices and the scale: the
word embeddings, whose rows train only for the tokens the data holds while AdamW's weight decay
scales every other row alike (``trainer.embedding_rows`` applies that decay as one factor, so the
product is exact). Any other is kept whole. A sha256 of the pretrained values the delta leaves in
place (every tensor not kept whole) is kept with it, so the model is rebuilt only over those same
weights.
"""

from __future__ import annotations

import hashlib

import torch

from ablate.errors import AblateError

ROWS, VALUES, SCALE = "@rows", "@values", "@scale"  # suffixes of a tensor kept by its rows


def _scale(ref: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor | None:
    """The one factor (``tensor``'s dtype) by which most rows of ``tensor`` are ``ref``'s, or
    None. The median ratio is within a rounding of it: it and its neighbours are tried."""
    ratios = tensor.double() / ref.double()
    ratios = ratios[ref.abs() > ref.abs().max() / 4]  # far from 0: products rounded least
    if not len(ratios):
        return None
    guess = ratios.median().to(tensor.dtype)
    up = torch.tensor(float("inf"), dtype=tensor.dtype)
    for factor in (guess, torch.nextafter(guess, up), torch.nextafter(guess, -up)):
        if 2 * int((ref * factor == tensor).all(1).sum()) > len(tensor):
            return factor
    return None


def changes(
    base: dict[str, torch.Tensor], trained: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The tensors of ``trained`` that differ from ``base``, whole or by their changed rows."""
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in trained.items():
        ref = base.get(name)
        if ref is None or ref.shape != tensor.shape or ref.dtype != tensor.dtype:
            kept[name] = tensor.contiguous()
        elif not torch.equal(ref, tensor):
            scale = None
            if tensor.dim() == 2 and 2 * int((ref == tensor).all(1).sum()) <= len(tensor):
                scale = _scale(ref, tensor)
            start = ref if scale is None else ref * scale
            rows = (start != tensor).any(1).nonzero().flatten() if tensor.dim() == 2 else None
            if rows is None or 2 * len(rows) >= len(tensor):
                kept[name] = tensor.contiguous()
                continue
            kept[name + ROWS], kept[name + VALUES] = rows, tensor[rows].contiguous()
            if scale is not None:
                kept[name + SCALE] = scale.reshape(())
    return kept


def digest(base: dict[str, torch.Tensor], kept: dict[str, torch.Tensor]) -> str:
    """The sha256 of the names, dtypes, shapes and values of the ``base`` tensors that ``kept``
    does not replace whole: the pretrained weights a delta is applied over."""
    sha = hashlib.sha256()
    for name in sorted(set(base) - set(kept)):
        tensor = base[name].detach().cpu().contiguous()
        sha.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        sha.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def apply(model: torch.nn.Module, kept: dict[str, torch.Tensor], sha256: str, base: str) -> None:
    """Put the trained tensors ``kept`` into ``model``, built from the pretrained weights at
    ``base``, once those weights are checked to be the ones training started from."""
    state = model.state_dict()
    whole = {n: t for n, t in kept.items() if not n.endswith((ROWS, VALUES, SCALE))}
    if digest(state, whole) != sha256:
        raise AblateError(
            f"model.name_or_path={base!r}: these are not the pretrained weights the run trained "
            f"from (their sha256 differs from the kept model's base_sha256); pass "
            f"load(..., base=<the folder of that model>)"
        )
    merged = {**state, **whole}
    for name in [n.removesuffix(ROWS) for n in kept if n.endswith(ROWS)]:
        scale = kept.get(name + SCALE)
        merged[name] = state[name].clone() if scale is None else state[name] * scale
        merged[name][kept[name + ROWS]] = kept[name + VALUES]
    model.load_state_dict(merged)
