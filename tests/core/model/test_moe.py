"""The MoE block: routing as transformers routes (softmax, top-k, optional renormalisation), the
expert dispatch op against a per-token loop over the chosen experts, the capturable gather
dispatch (the CUDA path) against the op, int4 experts against per-expert Int4Weight MLPs, and the
block inside torch.compile(fullgraph=True) with a dynamic row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rillet.core.model.mlp import activation, gated_mlp
from rillet.core.model.moe import MoE, gathered_experts
from rillet.core.quant.int4 import Int4Weight, int4_supported, quantize_module_weights

E, K, H, INTER = 8, 2, 64, 32


def _moe(norm_topk: bool = True, act: str = "silu", seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    moe = MoE(E, K, H, INTER, norm_topk, act, torch.float32)
    for p in moe.parameters():
        p.data.normal_(0.0, 0.2)
    return moe


def _loop(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """One token and one chosen expert at a time."""
    assert isinstance(moe.gate_up, torch.Tensor) and isinstance(moe.down, torch.Tensor)
    probs = torch.softmax(F.linear(x, moe.router), dim=-1)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        w, ids = probs[t].topk(K)
        if moe.norm_topk:
            w = w / w.sum()
        for wi, e in zip(w.tolist(), ids.tolist(), strict=True):
            out[t] += (
                wi * gated_mlp(x[t : t + 1], moe.gate_up[e], moe.down[e], activation(moe.act), x.dtype)[0]
            )
    return out


@pytest.mark.parametrize(("norm_topk", "act"), [(True, "silu"), (False, "silu"), (True, "gelu_tanh")])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_dispatch_equals_a_per_token_loop(norm_topk: bool, act: str, tokens: int) -> None:
    moe = _moe(norm_topk, act)
    x = torch.randn(tokens, H)
    with torch.inference_mode():
        got = moe(x)
        torch.testing.assert_close(got, _loop(moe, x), atol=1e-5, rtol=1e-5)
        ids, weights = moe.route(x)
        assert isinstance(moe.gate_up, torch.Tensor) and isinstance(moe.down, torch.Tensor)
        gathered = gathered_experts(x, ids, weights, moe.gate_up, moe.down, act)
        torch.testing.assert_close(gathered, got, atol=1e-5, rtol=1e-5)
    if norm_topk:
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens))


@pytest.mark.skipif(not int4_supported(), reason="no CPU int4 kernel in this torch")
def test_int4_experts_match_per_expert_int4_mlps() -> None:
    moe = _moe()
    assert isinstance(moe.gate_up, torch.Tensor) and isinstance(moe.down, torch.Tensor)
    gate_up = [Int4Weight(w) for w in moe.gate_up]
    down = [Int4Weight(w) for w in moe.down]
    x = torch.randn(9, H)
    with torch.inference_mode():
        ids, weights = moe.route(x)
        want = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(K):
                e = int(ids[t, j])
                y = gated_mlp(x[t : t + 1], gate_up[e], down[e], F.silu, x.dtype)[0]
                want[t] += (y * weights[t, j]).to(x.dtype)
        quantize_module_weights(moe, ("gate_up", "down"))
        # the same kernels on the same weights; an expert's rows go through them together rather
        # than one by one, which rounds the bf16 products differently (a few bf16 ulps)
        torch.testing.assert_close(moe(x), want, atol=0.05, rtol=0.02)


@pytest.mark.compiled
def test_moe_compiles_whole_with_a_dynamic_row_count() -> None:
    moe = _moe()
    compiled = torch.compile(moe, fullgraph=True, dynamic=True)  # a graph break raises
    with torch.inference_mode():
        for tokens in (2, 5, 16):
            x = torch.randn(tokens, H)
            torch.testing.assert_close(compiled(x), moe(x), atol=1e-5, rtol=1e-5)
