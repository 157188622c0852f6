"""A stand-in `flashinfer` module for the CPU tests of FlashInferAttentionBackend: the same wrapper
classes, plan()/run() signatures and paged layout rules as flashinfer's, the kernels replaced by a
loop in plain torch (`_paged_reference`). The `fake_flashinfer` fixture (tests/core/attention/
conftest.py) puts a module holding the two wrappers in sys.modules in place of the real one."""

from __future__ import annotations

import torch

from core_helpers.attention_steps import HKV, HQ, D


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
    def __init__(
        self,
        workspace: torch.Tensor,
        layout: str,
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        *,
        backend: str = "auto",
    ) -> None:
        assert layout == "NHD" and backend in FLASHINFER_PREFILL_BACKENDS
        if use_cuda_graph:  # the same checks as flashinfer's constructor
            assert qo_indptr_buf is not None and paged_kv_indptr_buf is not None
            assert paged_kv_indices_buf is not None and paged_kv_last_page_len_buf is not None
            assert len(qo_indptr_buf) == len(paged_kv_indptr_buf) == len(paged_kv_last_page_len_buf) + 1
        self.use_cuda_graph, self.backend = use_cuda_graph, backend
        self.batch = len(paged_kv_last_page_len_buf) if paged_kv_last_page_len_buf is not None else 0
        self.max_rows: int | None = None  # flashinfer latches it at the first plan in graph mode
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
        if self.use_cuda_graph:  # flashinfer 0.7.4 prefill.py: the batch is fixed, the row count
            assert len(last_page_len) == self.batch, "batch size is fixed in cudagraph mode"
            rows = int(qo_indptr[-1])
            self.max_rows = rows if self.max_rows is None else self.max_rows
            if rows > self.max_rows:  # flashinfer's own message
                raise ValueError(
                    f"The total number of rows in qo_indptr {rows} in cuda graph mode cannot exceed "
                    f"the number of rows set during initialization {self.max_rows}."
                )
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
