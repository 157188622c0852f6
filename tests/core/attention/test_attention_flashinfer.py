"""FlashInferAttentionBackend.

On CPU, a stand-in `flashinfer` module (same wrapper classes, plan()/run() signatures and paged
layout rules, kernels replaced by a loop in plain torch) checks everything the backend itself does:
the page layout it plans, which wrapper each step uses, the fixed CUDA-graph buffers, the K/V
write, and that the decode forward traces with torch.compile(fullgraph=True). The real kernels are
checked against the torch backend by the gpu-marked tests (skipped without CUDA + flashinfer).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.flashinfer_backend import FlashInferAttentionBackend
from rillet.core.attention.flashinfer_layout import page_indices, paged_kv_host
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.graphs.compile_modes import mark_batch_dynamic
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.static_buffers import StaticBuffers
from torch._inductor.utils import run_and_get_code

BS = 4  # block (page) size
HQ, HKV, D = 4, 2, 8


def _paged_reference(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    qo: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last: torch.Tensor,
    page_size: int,
    causal: bool,
    scale: float,
) -> torch.Tensor:
    """flashinfer's paged attention semantics, one sequence at a time (causal = bottom-right)."""
    out = torch.empty_like(q)
    for i in range(len(last)):
        pages = indices[int(indptr[i]) : int(indptr[i + 1])].long()
        kv_len = (len(pages) - 1) * page_size + int(last[i])
        k = kv[0][pages].flatten(0, 1)[:kv_len]  # [S, Hkv, D]
        v = kv[1][pages].flatten(0, 1)[:kv_len]
        rows = slice(int(qo[i]), int(qo[i + 1]))
        qi = q[rows]  # [L, Hq, D]
        group = qi.shape[1] // k.shape[1]
        s = torch.einsum("lhd,shd->hls", qi.float(), k.repeat_interleave(group, 1).float()) * scale
        if causal:
            n = qi.shape[0]
            allowed = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - n, kv_len)[:, None]
            s = s.masked_fill(~allowed, float("-inf"))
        p = s.softmax(-1)
        out[rows] = torch.einsum("hls,shd->lhd", p, v.repeat_interleave(group, 1).float()).to(q.dtype)
    return out


class FakeDecodeWrapper:
    def __init__(
        self,
        workspace: torch.Tensor,
        layout: str,
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
    ) -> None:
        assert layout == "NHD"
        self.use_cuda_graph, self.use_tensor_cores = use_cuda_graph, use_tensor_cores
        if use_cuda_graph:  # the same checks as flashinfer's constructor
            assert paged_kv_indptr_buffer is not None and paged_kv_last_page_len_buffer is not None
            assert paged_kv_indices_buffer is not None
            assert len(paged_kv_indptr_buffer) == len(paged_kv_last_page_len_buffer) + 1
        self.bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        self.num_plans = 0

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        pos_encoding_mode: str = "NONE",
        sm_scale: float | None = None,
        q_data_type: torch.dtype = torch.float16,
        kv_data_type: torch.dtype | None = None,
    ) -> None:
        _check_plan(indptr, indices, last_page_len, page_size)
        assert (num_qo_heads, num_kv_heads, head_dim, pos_encoding_mode) == (HQ, HKV, D, "NONE")
        if self.use_cuda_graph:  # copies into the fixed buffers; a captured kernel reads those
            ib, xb, lb = self.bufs
            assert ib is not None and xb is not None and lb is not None
            assert len(last_page_len) == len(lb), "batch size is fixed in cudagraph mode"
            ib.copy_(indptr)
            lb.copy_(last_page_len)
            xb[: len(indices)].copy_(indices)
            self.layout = (ib, xb, lb)
        else:
            self.layout = (indptr, indices, last_page_len)
        self.page_size, self.scale, self.num_plans = page_size, sm_scale, self.num_plans + 1

    def run(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        assert q.is_contiguous() and self.scale is not None
        qo = torch.arange(q.shape[0] + 1)
        return _paged_reference(q, kv, qo, *self.layout, self.page_size, causal=False, scale=self.scale)


# flashinfer 0.7.4's BatchPrefillWithPagedKVCacheWrapper(..., backend=...) values (prefill.py)
FLASHINFER_PREFILL_BACKENDS = ("auto", "fa2", "fa3", "cudnn", "trtllm-gen", "cute-dsl", "cute-dsl-prims")


class FakePrefillWrapper:
    def __init__(self, workspace: torch.Tensor, layout: str, *, backend: str = "auto") -> None:
        assert layout == "NHD" and backend in FLASHINFER_PREFILL_BACKENDS
        self.backend = backend
        self.num_plans = 0

    def plan(
        self,
        qo_indptr: torch.Tensor,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        *,
        causal: bool = False,
        sm_scale: float | None = None,
        q_data_type: torch.dtype = torch.float16,
        kv_data_type: torch.dtype | None = None,
    ) -> None:
        _check_plan(indptr, indices, last_page_len, page_size)
        assert qo_indptr.device.type == "cpu" and qo_indptr.dtype == torch.int32
        self.args = (qo_indptr, indptr, indices, last_page_len, page_size, causal, sm_scale)
        self.num_plans += 1

    def run(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        qo, indptr, indices, last, page_size, causal, scale = self.args
        assert scale is not None
        assert q.shape[0] == int(qo[-1])
        return _paged_reference(q, kv, qo, indptr, indices, last, page_size, causal=causal, scale=scale)


def _check_plan(indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor, page_size: int) -> None:
    # host metadata (a device tensor here would cost a sync in plan()), flashinfer's invariants
    assert indptr.device.type == "cpu" and last.device.type == "cpu"
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert len(indices) == int(indptr[-1]) and bool((indptr[1:] > indptr[:-1]).all())
    assert bool((last >= 1).all()) and bool((last <= page_size).all())


@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    mod = types.ModuleType("flashinfer")
    mod.BatchDecodeWithPagedKVCacheWrapper = FakeDecodeWrapper  # type: ignore[attr-defined]
    mod.BatchPrefillWithPagedKVCacheWrapper = FakePrefillWrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    yield mod


def _backend(**kw: Any) -> FlashInferAttentionBackend:
    return FlashInferAttentionBackend(HQ, HKV, D, BS, torch.float32, "cpu", workspace_bytes=1024, **kw)


def test_host_page_layout() -> None:
    indptr, last, pages = paged_kv_host([1, 4, 5, 9, 0], BS)
    assert indptr.tolist() == [0, 1, 2, 4, 7, 8]
    assert last.tolist() == [1, 4, 1, 1, 1]  # a 0-token context counts as the dummy slot
    assert pages.tolist() == [1, 1, 2, 3, 1]
    tables = torch.tensor([[7, 0, 0], [3, 9, 0], [4, 5, 0], [6, 8, 2], [0, 0, 0]], dtype=torch.int32)
    assert page_indices(tables, indptr, pages).tolist() == [7, 3, 4, 5, 6, 8, 2, 0]


def test_tensor_cores_follow_gqa_group(fake_flashinfer: types.ModuleType) -> None:
    assert FlashInferAttentionBackend(32, 8, 128, 16, torch.float32, "cpu", workspace_bytes=64).tensor_cores
    assert not FlashInferAttentionBackend(9, 3, 64, 16, torch.float32, "cpu", workspace_bytes=64).tensor_cores


def test_prefill_wrapper_gets_the_configured_kernels(fake_flashinfer: types.ModuleType) -> None:
    # fa2 by default: flashinfer's own default ("auto") picks FA3 on an H200 for queries > 64 tokens
    assert _backend()._prefill.backend == "fa2"
    for kernels in ("fa2", "fa3", "auto"):
        assert _backend(prefill_backend=kernels)._prefill.backend == kernels
    with pytest.raises(ValueError, match="prefill_backend must be one of fa2, fa3, auto"):
        _backend(prefill_backend="fa4")


def test_config_key_reaches_the_prefill_wrapper(
    fake_flashinfer: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attention.flashinfer_prefill_backend, through the runtime's backend construction."""
    from rillet.core import build
    from rillet.core.attention.select import AttentionSelection
    from rillet.core.config import load_config
    from rillet.core.model.arch import ModelArch

    chosen = AttentionSelection("flashinfer", "flashinfer", [])
    monkeypatch.setattr(build, "select_attention_backend", lambda cfg, device, arch=None, kv=None: chosen)
    monkeypatch.setattr("rillet.core.attention.flashinfer_backend.WORKSPACE_BYTES", 1024)
    arch = ModelArch(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=HQ,
        num_kv_heads=HKV,
        head_dim=D,
    )
    for overrides, want in (([], "fa2"), (["attention.flashinfer_prefill_backend=fa3"], "fa3")):
        be = build.make_backend(load_config(None, overrides), arch, torch.device("cpu"), torch.float32)
        assert isinstance(be, FlashInferAttentionBackend) and be._prefill.backend == want


class Step:
    """Random sequences over a shared paged cache; builds AttentionMetadata for a step."""

    def __init__(
        self, cached: list[int], new: list[int], seed: int, width: int = 6, head_dim: int = D
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        perm = (torch.randperm(40, generator=g) + 1).tolist()  # distinct blocks, never 0
        self.tables = [perm[i * width : (i + 1) * width] for i in range(len(cached))]
        seq_lens = [c + n for c, n in zip(cached, new, strict=True)]
        slots = [
            t[p // BS] * BS + p % BS
            for t, c, s in zip(self.tables, cached, seq_lens, strict=True)
            for p in range(c, s)
        ]
        self.meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            query_start=torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.tensor(self.tables, dtype=torch.int32),
            query_lens_cpu=list(new),
            seq_lens_cpu=seq_lens,
            block_size=BS,
            num_prefills=sum(1 for c, n in zip(cached, new, strict=True) if n > 1 or c == 0),
        )
        t = sum(new)
        self.head_dim = head_dim
        self.q, self.k, self.v = (torch.randn(t, h, head_dim, generator=g) for h in (HQ, HKV, HKV))
        k_cache, v_cache = (torch.randn(41, BS, HKV, head_dim, generator=g) for _ in range(2))
        self.cache = (k_cache, v_cache)


def _run_both(step: Step, backend: FlashInferAttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
    kc, vc = (c.clone() for c in step.cache)
    scale = step.head_dim**-0.5
    ref = TorchAttentionBackend().forward(step.q, step.k, step.v, kc, vc, step.meta, scale)
    kf, vf = (c.clone() for c in step.cache)
    backend.begin_step(step.meta)
    got = backend.forward(step.q, step.k, step.v, kf, vf, step.meta, scale)
    assert torch.equal(kf, kc) and torch.equal(vf, vc)  # the same K/V written at the same slots
    return got, ref


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


def test_no_graph_sizes_no_graph_wrappers(fake_flashinfer: types.ModuleType) -> None:
    assert _backend()._graph_decode == {}
    with pytest.raises(ValueError, match="max_blocks_per_seq"):
        _backend(graph_batch_sizes=(1, 2))


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


def test_decode_forward_traces_fullgraph(fake_flashinfer: types.ModuleType) -> None:
    """The model's decode step around the op compiles with no graph break, same result, same K/V
    written to the cache."""
    from rillet.core.model.arch import ModelArch
    from rillet.core.model.decoder import allocate_kv_cache, build_model

    torch._dynamo.reset()
    arch = ModelArch(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=HQ,
        num_kv_heads=HKV,
        head_dim=D,
        max_position=64,
    )
    backend = _backend(graph_batch_sizes=(4,), max_blocks_per_seq=6)
    model = build_model(arch, backend, torch.float32, "cpu")
    model.init_random(seed=0, std=0.2)
    caches = allocate_kv_cache(arch, 41, BS, torch.float32, "cpu")
    step = Step([3, 9, 14, 1], [1, 1, 1, 1], seed=7)
    ids, pos = torch.tensor([5, 6, 7, 8]), step.meta.seq_lens.long() - 1

    def decode(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return model(ids, pos, caches, step.meta)

    backend.begin_step(step.meta)
    before = [c.clone() for kv in caches for c in kv[:2]]
    with torch.inference_mode():
        want = decode(ids, pos)
        written = [c.clone() for kv in caches for c in kv[:2]]
        for compiler in ("eager", "aot_eager", "inductor"):  # dynamo, the op's fake impl, Inductor
            for c, b in zip((c for kv in caches for c in kv[:2]), before, strict=True):
                c.copy_(b)
            fn = torch.compile(decode, fullgraph=True, dynamic=False, backend=compiler)
            if compiler == "inductor":
                got, code = run_and_get_code(fn, ids, pos)
                # the op writes K/V in place: no buffer of the cache's size (41 blocks) is ever
                # allocated, the cache is never copied (a write traced into the graph was
                # re-inplaced on CPU but copied whole on CUDA: core/attention/flashinfer_op.py)
                assert "flashinfer_attention" in code[0] and "empty_strided_cpu((41," not in code[0]
            else:
                got = fn(ids, pos)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            # the compiled step wrote the new K/V, and they are what the op read
            for c, w in zip((c for kv in caches for c in kv[:2]), written, strict=True):
                assert torch.equal(c, w), compiler
    torch._dynamo.reset()


class Decoder:
    """graphs' DecodeModel over DecoderModel, as the model runner adapts it (metadata built in
    prepare_decode, reused by the forward)."""

    def __init__(self, model: Any, caches: Any) -> None:
        self.model, self.caches = model, caches
        self.meta: AttentionMetadata | None = None

    def prepare_decode(self, batch: DecodeBatch) -> None:
        self.meta = AttentionMetadata(
            batch.slot_mapping,
            batch.query_start,
            batch.seq_lens,
            batch.block_tables,
            [1] * batch.num_rows,
            batch.seq_lens_cpu,
            BS,
            0,
        )
        self.model.backend.begin_step(self.meta)

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        return self.model(batch.input_ids, batch.positions, self.caches, self.meta)


def test_decode_compiles_once_for_every_bucket_above_one(fake_flashinfer: types.ModuleType) -> None:
    """GraphRunner's compile contract: row dimension dynamic, no recompile from bucket to bucket."""
    from rillet.core.model.arch import ModelArch
    from rillet.core.model.decoder import allocate_kv_cache, build_model

    torch._dynamo.reset()
    arch = ModelArch(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=HQ,
        num_kv_heads=HKV,
        head_dim=D,
        max_position=64,
    )
    model = build_model(
        arch, _backend(graph_batch_sizes=(2, 3, 4), max_blocks_per_seq=6), torch.float32, "cpu"
    )
    model.init_random(seed=0, std=0.2)
    decoder = Decoder(model, allocate_kv_cache(arch, 41, BS, torch.float32, "cpu"))
    static = StaticBuffers.allocate(4, 6, torch.device("cpu"))
    compiled = torch.compile(decoder.forward_decode, fullgraph=True, backend="eager")
    with torch.inference_mode():
        for i, n in enumerate((4, 3, 2)):
            step = Step([2 + 5 * j for j in range(n)], [1] * n, seed=n)
            m = step.meta
            batch = DecodeBatch(
                torch.arange(1, n + 1),
                m.seq_lens.long() - 1,
                m.slot_mapping,
                m.seq_lens,
                m.block_tables,
                m.query_start,
                m.seq_lens_cpu,
            )
            view = static.fill(batch, n)
            decoder.prepare_decode(view)
            mark_batch_dynamic(view)
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                got = compiled(view)
            torch.testing.assert_close(got, decoder.forward_decode(view), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


# --- the real kernels (CUDA + flashinfer) --------------------------------------------------------


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
