"""Mixture-of-experts MLP: a router picks k experts per token, their gated MLPs run on it, and
the outputs are summed with the routing weights (Mixtral; Qwen3-MoE / OLMoE-style routing).

Routing is traced as plain torch (softmax over the experts in float32, top-k, optional
renormalisation, as transformers does). The experts live in one stacked tensor per projection
([E, 2I, H] gate|up, [E, H, I] down) and run through a dispatch whose cost follows the active
experts, not all of them:

  - CPU (eager, and inside the compiled decode step): the custom op `rillet::moe_experts`
    (`_int4` for Int4Experts). The compiler sees one opaque node with a [T, H] output, so the
    step compiles whole (no graph break) while the op, in eager, sorts the token slots by expert
    and runs one matmul per active expert on its rows (each active expert's weights read once),
    then adds the weighted rows back in expert order, as transformers does;
  - CUDA: a gather of each slot's expert weights and a batched matmul: no host sync, so a CUDA
    graph can capture it (at large batches it reads an expert once per slot, not once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rillet.core.model.mlp import activation
from rillet.core.quant.int4 import Int4Experts, int4_expert_mm
from torch import nn


def _by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """ids [T, k] -> (slot order sorted by expert [T*k], token of each sorted slot, slots per expert)."""
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts: list[int] = torch.bincount(flat, minlength=num_experts).tolist()
    return order, torch.div(order, ids.shape[1], rounding_mode="floor"), counts


def _combine(x: torch.Tensor, rows: torch.Tensor, ys: list[torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    y = torch.cat(ys) * w[:, None]  # [T*k, H], the routing weight of each sorted slot
    return torch.zeros_like(x).index_add_(0, rows, y.to(x.dtype))


@torch.library.custom_op("rillet::moe_experts", mutates_args=())
def moe_experts(
    x: torch.Tensor,  # [T, H]
    ids: torch.Tensor,  # [T, k] int64: each token's experts
    weights: torch.Tensor,  # [T, k] float32: their routing weights
    gate_up: torch.Tensor,  # [E, 2I, H]
    down: torch.Tensor,  # [E, H, I]
    act: str,
) -> torch.Tensor:  # [T, H]
    act_fn = activation(act)
    order, rows, counts = _by_expert(ids, gate_up.shape[0])
    xs = x.index_select(0, rows)  # [T*k, H], grouped by expert
    ys, start = [], 0
    for e, n in enumerate(counts):
        if n:
            gate, up = F.linear(xs[start : start + n], gate_up[e]).chunk(2, dim=-1)
            ys.append(F.linear(act_fn(gate) * up, down[e]))
            start += n
    return _combine(x, rows, ys, weights.reshape(-1)[order])


@moe_experts.register_fake
def _(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str,
) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("rillet::moe_experts_int4", mutates_args=())
def moe_experts_int4(
    x: torch.Tensor,  # [T, H]
    ids: torch.Tensor,  # [T, k]
    weights: torch.Tensor,  # [T, k] float32
    gate_up_packed: torch.Tensor,  # Int4Experts buffers of the [E, 2I, H] and [E, H, I] stacks
    gate_up_scales: torch.Tensor,
    down_packed: torch.Tensor,
    down_scales: torch.Tensor,
    act: str,
) -> torch.Tensor:  # [T, H]
    act_fn = activation(act)
    order, rows, counts = _by_expert(ids, gate_up_packed.shape[0])
    xs = x.index_select(0, rows)
    ys, start = [], 0
    for e, n in enumerate(counts):
        if n:
            gate, up = int4_expert_mm(xs[start : start + n], gate_up_packed, gate_up_scales, e).chunk(
                2, dim=-1
            )
            h = act_fn(gate.to(x.dtype)) * up  # as the dense int4 MLP: bf16 products, widened
            ys.append(int4_expert_mm(h, down_packed, down_scales, e))
            start += n
    return _combine(x, rows, ys, weights.reshape(-1)[order])


@moe_experts_int4.register_fake
def _(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up_packed: torch.Tensor,
    gate_up_scales: torch.Tensor,
    down_packed: torch.Tensor,
    down_scales: torch.Tensor,
    act: str,
) -> torch.Tensor:
    return torch.empty_like(x)


def gathered_experts(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: str,
) -> torch.Tensor:  # [T, H]: the capturable dispatch (no host sync, shapes from T and k only)
    t, k = ids.shape
    flat = ids.reshape(-1)
    xs = x.repeat_interleave(k, dim=0)[..., None]  # [T*k, H, 1]
    gate, up = torch.bmm(gate_up.index_select(0, flat), xs)[..., 0].chunk(2, dim=-1)  # [T*k, I]
    h = (activation(act)(gate) * up)[..., None]
    y = torch.bmm(down.index_select(0, flat), h)[..., 0] * weights.reshape(-1, 1)  # [T*k, H]
    return y.view(t, k, -1).sum(1).to(x.dtype)


class MoE(nn.Module):
    """Router [E, H] (never quantized: routing is a ranking) and the stacked experts."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden: int,
        inter: int,
        norm_topk: bool,
        act: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        activation(act)  # an unknown activation fails at build time, not at the first step
        self.top_k, self.norm_topk, self.act = top_k, norm_topk, act
        self.router = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype), requires_grad=False)
        self.gate_up: nn.Parameter | Int4Experts = nn.Parameter(
            torch.empty(num_experts, 2 * inter, hidden, dtype=dtype), requires_grad=False
        )
        self.down: nn.Parameter | Int4Experts = nn.Parameter(
            torch.empty(num_experts, hidden, inter, dtype=dtype), requires_grad=False
        )

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [T, H] -> (expert ids [T, k], routing weights [T, k] float32)."""
        probs = torch.softmax(F.linear(h, self.router).float(), dim=-1)  # [T, E]
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        ids, weights = self.route(h)
        gu, dn = self.gate_up, self.down
        if isinstance(gu, Int4Experts) and isinstance(dn, Int4Experts):
            return torch.ops.rillet.moe_experts_int4(
                h, ids, weights, gu.packed, gu.scales_zeros, dn.packed, dn.scales_zeros, self.act
            )
        assert isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor)
        if h.is_cuda:
            return gathered_experts(h, ids, weights, gu, dn, self.act)
        return torch.ops.rillet.moe_experts(h, ids, weights, gu, dn, self.act)
