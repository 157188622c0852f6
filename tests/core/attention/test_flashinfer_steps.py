"""FlashInferAttentionBackend's steps on CPU, on the stand-in `flashinfer` module (conftest.py):
prefill and decode steps equal the torch backend's and write the same K/V, decode steps use the
wrapper of their CUDA-graph bucket and its fixed buffers, a forward needs the step's plan and its
scale, and a padding row's K/V go to the dummy block."""

from __future__ import annotations

import types

import pytest
import torch
from core_helpers.attention_steps import D, Step
from core_helpers.attention_steps import backend as _backend
from core_helpers.attention_steps import run_both as _run_both


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
