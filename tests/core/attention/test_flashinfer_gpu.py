"""FlashInferAttentionBackend's real kernels (CUDA + flashinfer; skipped without them): equal to
the torch backend on prefill and decode steps, and a captured CUDA graph replays a new plan."""

from __future__ import annotations

import pytest
import torch
from core_helpers.attention_steps import BS, HKV, HQ, Step
from core_helpers.attention_steps import run_both as _run_both
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.flashinfer_backend import FlashInferAttentionBackend
from rillet.core.attention.torch_backend import TorchAttentionBackend


def _flashinfer_ready() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


gpu = pytest.mark.skipif(not _flashinfer_ready(), reason="needs CUDA and flashinfer")
GPU_D = 64  # a head size flashinfer has kernels for (the GPU kit has bf16 64 precompiled)


def _to_cuda(step: Step, dtype: torch.dtype) -> Step:
    m = step.meta
    step.meta = AttentionMetadata(
        m.slot_mapping.cuda(),
        m.query_start.cuda(),
        m.seq_lens.cuda(),
        m.block_tables.cuda(),
        m.query_lens_cpu,
        m.seq_lens_cpu,
        m.block_size,
        m.num_prefills,
    )
    step.q, step.k, step.v = (x.to("cuda", dtype) for x in (step.q, step.k, step.v))
    step.cache = (step.cache[0].to("cuda", dtype), step.cache[1].to("cuda", dtype))
    return step


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("cached", "new"), [([0, 7, 12, 3, 20], [6, 5, 1, 1, 1]), ([3, 9, 30, 17], [1, 1, 1, 1])]
)
def test_gpu_flashinfer_matches_torch_backend(cached: list[int], new: list[int]) -> None:
    step = _to_cuda(Step(cached, new, seed=3, head_dim=GPU_D), torch.bfloat16)
    backend = FlashInferAttentionBackend(
        HQ, HKV, GPU_D, BS, torch.bfloat16, "cuda", graph_batch_sizes=(4,), max_blocks_per_seq=6
    )
    got, ref = _run_both(step, backend)
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@gpu
def test_gpu_graph_wrapper_replays_a_new_plan() -> None:
    """Capture with one plan, replay after planning other lengths: equals eager on the new plan."""
    first = _to_cuda(Step([3, 9, 1, 20], [1] * 4, seed=4, head_dim=GPU_D), torch.bfloat16)
    backend = FlashInferAttentionBackend(
        HQ, HKV, GPU_D, BS, torch.bfloat16, "cuda", graph_batch_sizes=(4,), max_blocks_per_seq=6
    )
    kc, vc = first.cache
    q, k, v = (x.clone() for x in (first.q, first.k, first.v))
    slots = first.meta.slot_mapping.clone()
    meta = AttentionMetadata(
        slots,
        first.meta.query_start,
        first.meta.seq_lens,
        first.meta.block_tables,
        [1] * 4,
        first.meta.seq_lens_cpu,
        BS,
        0,
    )
    backend.begin_step(meta)
    backend.forward(q, k, v, kc, vc, meta, GPU_D**-0.5)  # warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, kc, vc, meta, GPU_D**-0.5)
    second = _to_cuda(Step([12, 2, 22, 7], [1] * 4, seed=5, head_dim=GPU_D), torch.bfloat16)
    kc.copy_(second.cache[0])
    vc.copy_(second.cache[1])
    for dst, src in ((q, second.q), (k, second.k), (v, second.v), (slots, second.meta.slot_mapping)):
        dst.copy_(src)
    meta2 = AttentionMetadata(
        slots,
        second.meta.query_start,
        second.meta.seq_lens,
        second.meta.block_tables,
        [1] * 4,
        second.meta.seq_lens_cpu,
        BS,
        0,
    )
    backend.begin_step(meta2)  # plan() rewrites the fixed buffers the graph reads
    graph.replay()
    ref = TorchAttentionBackend().forward(
        second.q,
        second.k,
        second.v,
        second.cache[0].clone(),
        second.cache[1].clone(),
        second.meta,
        GPU_D**-0.5,
    )
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
