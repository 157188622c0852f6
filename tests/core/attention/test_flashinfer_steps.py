"""FlashInferAttentionBackend's steps on CPU, on the stand-in `flashinfer` module (conftest.py):
prefill and decode steps equal the torch backend's and write the same K/V, decode steps use the
wrapper of their CUDA-graph bucket and its fixed buffers, verify steps a graph wrapper per (rows,
Q), a forward needs the step's plan and its scale, and a padding row's K/V go to the dummy block."""

from __future__ import annotations

import types

import pytest
import torch
from core_helpers.attention_steps import HKV, HQ, D, Step
from core_helpers.attention_steps import backend as _backend
from core_helpers.attention_steps import run_both as _run_both
from rillet.core.attention.base import VerifyMetadata
from rillet.core.attention.torch_backend import TorchAttentionBackend


@pytest.mark.parametrize(
    ("cached", "new"),
    [
        ([0, 0], [5, 9]),  # fresh prompts
        ([0, 7, 12, 3, 20], [6, 5, 1, 1, 1]),  # fresh, continued chunk, decodes in one step
        ([4, 11, 0], [1, 1, 1]),  # a 1-token fresh prompt counts as a prefill
    ],
)
def test_prefill_steps_match_torch_backend(
    fake_flashinfer: types.ModuleType, cached: list[int], new: list[int]
) -> None:
    backend = _backend(graph_batch_sizes=(1, 2, 4), max_blocks_per_seq=6)
    got, ref = _run_both(Step(cached, new, seed=len(new)), backend)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    assert backend._prefill.num_plans == 1 and backend._decode.num_plans == 0


@pytest.mark.parametrize(("n", "graphed"), [(1, True), (3, False), (4, True), (5, False)])
def test_decode_steps_use_the_bucket_wrapper(
    fake_flashinfer: types.ModuleType, n: int, graphed: bool
) -> None:
    backend = _backend(graph_batch_sizes=(4, 1, 2), max_blocks_per_seq=6)
    got, ref = _run_both(Step([3 + 4 * i for i in range(n)], [1] * n, seed=n), backend)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    wrapper = backend._graph_decode.get(n, backend._decode)
    assert wrapper.use_cuda_graph == graphed and wrapper.num_plans == 1
    assert backend._active is wrapper and backend._prefill.num_plans == 0
    if graphed:  # the graph wrappers share one set of fixed buffers, sized for the largest bucket
        ib, xb, lb = wrapper.bufs
        assert ib.data_ptr() == backend._indptr_buf.data_ptr() and len(ib) == n + 1
        assert xb.data_ptr() == backend._indices_buf.data_ptr() and len(xb) == 4 * 6
        assert lb.data_ptr() == backend._last_page_buf.data_ptr() and len(lb) == n


def test_forward_needs_a_plan_and_the_planned_scale(fake_flashinfer: types.ModuleType) -> None:
    step = Step([2], [1], seed=0)
    backend = _backend()
    with pytest.raises(RuntimeError, match="begin_step"):
        backend.forward(step.q, step.k, step.v, *step.cache, step.meta, D**-0.5)
    backend.begin_step(step.meta)
    with pytest.raises(ValueError, match="sm_scale"):
        backend.forward(step.q, step.k, step.v, *step.cache, step.meta, 1.0)


def test_padding_slot_minus_one_goes_to_the_dummy_block(fake_flashinfer: types.ModuleType) -> None:
    step = Step([2, 6], [1, 1], seed=1)
    step.meta.slot_mapping[1] = -1
    backend = _backend()
    backend.begin_step(step.meta)
    kc, vc = (c.clone() for c in step.cache)
    backend.forward(step.q, step.k, step.v, kc, vc, step.meta, D**-0.5)
    want = step.cache[0].clone()
    want[step.tables[0][0], 2] = step.k[0]  # sequence 0: position 2 in its first block
    want[0, 0] = step.k[1]  # the padding row: slot 0
    assert torch.equal(kc, want)


def test_verify_steps_of_each_query_count_get_a_graph_wrapper_of_their_own(
    fake_flashinfer: types.ModuleType,
) -> None:
    """flashinfer latches a graph-mode prefill wrapper's query-row count at its first plan() and
    refuses more rows later (the H200 run of 2026-12-04 hit it: Q = 2, then 3, on one wrapper), so
    begin_verify keeps a wrapper per (rows, Q). Each verify step equals the torch backend's
    prefill of the same rows (every query real) and writes the same K/V."""
    be = _backend(graph_batch_sizes=(1, 2), max_blocks_per_seq=6)
    for nq in (2, 4, 3):
        step = Step([5, 9], [nq, nq], seed=nq)
        scale = D**-0.5
        kc, vc = (c.clone() for c in step.cache)
        ref = TorchAttentionBackend().forward(step.q, step.k, step.v, kc, vc, step.meta, scale)
        batch = types.SimpleNamespace(
            input_ids=torch.zeros(2, nq, dtype=torch.long),
            block_tables=step.meta.block_tables,
            seq_lens_cpu=step.meta.seq_lens_cpu,
            query_lens_cpu=[nq, nq],
        )
        be.begin_verify(batch, 4)
        meta = VerifyMetadata(
            step.meta.slot_mapping.view(2, nq),
            step.meta.seq_lens,
            torch.tensor([nq, nq]),
            step.meta.block_tables,
        )
        kf, vf = (c.clone() for c in step.cache)
        got = be.forward(step.q, step.k, step.v, kf, vf, meta, scale)
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
        assert torch.equal(kf, kc) and torch.equal(vf, vc)
    assert sorted(be._graph_verify) == [(2, 2), (2, 3), (2, 4)]
    assert all(w.use_cuda_graph and w.max_rows == n * q for (n, q), w in be._graph_verify.items())
    one = be._graph_verify[2, 2]
    with pytest.raises(ValueError, match="cannot exceed"):  # what a shared wrapper would have done
        one.plan(torch.tensor([0, 3, 6], dtype=torch.int32), *one.args[1:4], HQ, HKV, D, 4, causal=True)
