"""Checkpoint names of Gemma 3's tower and projector -> Gemma3VisionEncoder's parameters.

Released checkpoints write `vision_tower.vision_model.*` and `multi_modal_projector.*`;
transformers 5's save_pretrained writes `vision_tower.*` (no `vision_model.`), and its in-memory
names add `model.` in front. SigLIP's attention-pooling head (`head.*`) is never used by Gemma 3
and is skipped."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

_TOWER = ("model.vision_tower.", "vision_tower.")
_PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")


def claims(name: str) -> bool:
    """Whether checkpoint tensor `name` belongs to the image side (the text loader skips it)."""
    return name.startswith(_TOWER + _PROJECTOR)


def module_name(name: str) -> str | None:
    """The encoder's parameter for checkpoint tensor `name`; None: a tensor with no use."""
    for p in _PROJECTOR:
        if name.startswith(p):
            return "multi_modal_projector." + name[len(p) :]
    for p in _TOWER:
        if name.startswith(p):
            rest = name[len(p) :]
            rest = rest.removeprefix("vision_model.")
            return None if rest.startswith("head.") else "vision_model." + rest
    raise ValueError(f"load_weights: '{name}' is not a Gemma 3 vision weight")


def load_vision_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy the tensors in (casting dtype and device). ValueError on an unknown name, a shape
    mismatch, or a parameter left unfilled."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file_name, tensor in weights:
        name = module_name(file_name)
        if name is None:
            continue
        if name not in params:
            raise ValueError(f"load_weights: unknown weight '{file_name}' for gemma3's vision tower")
        dst = params[name].data
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(
                f"load_weights: '{file_name}' has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
            )
        dst.copy_(tensor)
        loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"load_weights: missing vision weights {missing[:5]}{more}")
