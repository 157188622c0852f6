"""Checkpoint tensor names -> the decoder's parameters.

Every loader (Hugging Face folders, GGUF files, the tensor-parallel shard readers) hands out
tensors under Hugging Face names. A file tensor first splits into canonical parts
(`canonical_parts`): the Llama / Qwen3-MoE names, one per projection and per expert. Phi-3's fused
`qkv_proj` / `gate_up_proj`, Mixtral's `block_sparse_moe.experts.{e}.w1/w2/w3`, the stacked
`mlp.experts.{gate,up,down}_proj` of a GGUF ([E, rows, cols]) and a multimodal Gemma 3's
`language_model.` prefix all come down to them, each part an index into the file tensor. The
model then maps each canonical name to a slice of its fused parameters (`weight_targets`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import NamedTuple

import torch
from rillet.core.model.arch import ModelArch
from torch import nn

Index = tuple[int | slice, ...]  # into a tensor's leading dims; () = the whole tensor


class Part(NamedTuple):
    name: str  # canonical HF name
    where: Index  # which part of the file tensor it is


_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_LAYER = re.compile(r"^(model\.layers\.\d+\.)(.+)$")
_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_SKIPPED = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def _strip_prefix(name: str) -> str | None:
    if name.startswith(_SKIPPED) or name.endswith("rotary_emb.inv_freq"):
        return None
    for old, new in _PREFIXES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def canonical_parts(name: str, shape: tuple[int, ...], arch: ModelArch) -> list[Part]:
    """The canonical tensors inside file tensor `name` of `shape` ([] for one with no use)."""
    full = _strip_prefix(name)
    m = _LAYER.match(full) if full is not None else None
    if full is None or m is None:
        return [] if full is None else [Part(full, ())]
    p, rest = m.group(1), m.group(2)
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    if rest == "self_attn.qkv_proj.weight":  # Phi-3
        rows = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
        return [Part(f"{p}self_attn.{n}.weight", (slice(lo, hi),)) for n, (lo, hi) in rows.items()]
    if rest == "mlp.gate_up_proj.weight":  # Phi-3
        i = shape[0] // 2
        return [
            Part(f"{p}mlp.gate_proj.weight", (slice(0, i),)),
            Part(f"{p}mlp.up_proj.weight", (slice(i, 2 * i),)),
        ]
    mix = re.match(r"^block_sparse_moe\.(gate|experts\.(\d+)\.(w[123]))\.weight$", rest)
    if mix is not None:  # Mixtral
        if mix.group(1) == "gate":
            return [Part(f"{p}mlp.gate.weight", ())]
        return [Part(f"{p}mlp.experts.{mix.group(2)}.{_MIXTRAL[mix.group(3)]}.weight", ())]
    stacked = re.match(r"^mlp\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)\.weight$", rest)
    if stacked is not None:  # [E, rows, cols] (GGUF's ffn_*_exps)
        proj, e_count = stacked.group(1), shape[0]
        if proj != "gate_up_proj":
            return [Part(f"{p}mlp.experts.{e}.{proj}.weight", (e,)) for e in range(e_count)]
        i = shape[1] // 2
        return [
            Part(f"{p}mlp.experts.{e}.{n}_proj.weight", (e, slice(lo, lo + i)))
            for e in range(e_count)
            for n, lo in (("gate", 0), ("up", i))
        ]
    return [Part(full, ())]


Target = tuple[nn.Parameter, Index, bool]  # parameter, slice of it, a norm (gets norm_offset)


def expert_targets(
    p: str, router: nn.Parameter, gate_up: object, down: object, a: ModelArch
) -> dict[str, Target]:
    """The canonical names of one MoE layer (prefix `p`): the router and each expert's rows."""
    assert isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter)
    i = a.moe_intermediate_size
    t: dict[str, Target] = {f"{p}mlp.gate.weight": (router, (), False)}
    for e in range(a.num_experts):
        t[f"{p}mlp.experts.{e}.gate_proj.weight"] = (gate_up, (e, slice(0, i)), False)
        t[f"{p}mlp.experts.{e}.up_proj.weight"] = (gate_up, (e, slice(i, 2 * i)), False)
        t[f"{p}mlp.experts.{e}.down_proj.weight"] = (down, (e,), False)
    return t


def load_into(
    targets: dict[str, Target],
    weights: Iterable[tuple[str, torch.Tensor]],
    arch: ModelArch,
    tied: bool,
    on_filled: Callable[[nn.Parameter], None] | None = None,
) -> None:
    """Copy HF-named tensors into the targets' parameters (casting dtype/device); `tied`: the
    LM head is the embedding (a file's lm_head.weight is skipped). `on_filled(param)` runs once
    every part of a parameter is in, while the rest still loads (the int4 model quantizes each
    projection then: one float32 matrix at a time, never the whole float32 model), and the
    parameter is no longer referenced here afterwards.

    Raises ValueError on an unknown name, a shape mismatch, or a parameter left unfilled.
    """
    loaded: set[str] = set()
    names = set(targets)
    parts_left = Counter(id(param) for name, (param, _, _) in targets.items() if not _skipped(name, tied))
    for file_name, tensor in weights:
        for name, index in canonical_parts(file_name, tuple(tensor.shape), arch):
            if name == "lm_head.weight" and tied:
                continue  # tied to the embedding: nothing to load
            if name not in targets:
                if name in loaded:  # a parameter handed over to on_filled already
                    raise ValueError(f"load_weights: '{file_name}' holds '{name}' a second time")
                raise ValueError(f"load_weights: unknown weight '{file_name}' for {arch.architecture}")
            param, where, is_norm = targets[name]
            src = tensor[index] if index else tensor
            dst = param.data[where] if where else param.data
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError(
                    f"load_weights: '{name}' has shape {tuple(src.shape)}, expected {tuple(dst.shape)}"
                )
            dst.copy_(src.float() + arch.norm_offset if is_norm and arch.norm_offset else src)
            loaded.add(name)
            parts_left[id(param)] -= 1
            if parts_left[id(param)] == 0 and on_filled is not None:
                _drop(targets, param)
                del dst
                on_filled(param)
    missing = sorted(names - loaded)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"load_weights: missing weights {missing[:5]}{more}")


def _skipped(name: str, tied: bool) -> bool:
    return name == "lm_head.weight" and tied


def _drop(targets: dict[str, Target], param: nn.Parameter) -> None:
    for name in [n for n, (p, _, _) in targets.items() if p is param]:
        del targets[name]
