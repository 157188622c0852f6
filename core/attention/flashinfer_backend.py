"""Paged attention with flashinfer (CUDA): BatchPrefill/BatchDecode WithPagedKVCacheWrapper, NHD.

Per step, `begin_step` (host, never inside a graph) turns the metadata into flashinfer's paged
layout and calls plan() on exactly one wrapper:
  - a step with prefills: the prefill wrapper (causal, bottom-right aligned, so decode rows mixed
    into the step are served by it too);
  - a decode-only step of n rows: the CUDA-graph decode wrapper built for bucket n when n is one
    of `graph_batch_sizes`, else the plain decode wrapper.
Graph wrappers share one set of fixed indptr / indices / last_page_len buffers (only one is planned
per step, and a captured graph reads the same addresses at replay, after a fresh plan()).

`forward` makes q contiguous (traced: in a compiled step the copy fuses into RoPE's kernel), then
calls a torch custom op, opaque to torch.compile, that writes the new K/V at slot_mapping and runs
the planned wrapper (`attend`; why an op, and one that declares no mutation: flashinfer_op.py).
The page layout plan() takes is computed in flashinfer_layout.py.

KV storage (`kv_dtype`, cache.dtype): the model's dtype or fp8 e4m3, which flashinfer reads itself
(plan()'s kv_data_type) with per-layer scales of 1.0 (no calibration: the values are clamped to
+-448 and cast, attention/kv_cache.py). int8 codes it cannot read: such a pool gets the torch
backend (build.py). The fp8 path is written for the GPU and has not run on one yet.

flashinfer is imported in the constructor, so importing this module never needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, get_args

import torch
from rillet.core.attention.base import AttentionBackend, AttentionMetadata, StepMetadata
from rillet.core.attention.flashinfer_layout import page_indices, paged_kv_host, qo_indptr_host
from rillet.core.attention.flashinfer_op import register_attention_op
from rillet.core.attention.kv_cache import encode
from rillet.core.attention.plan_staging import PlanStaging
from rillet.core.config import FlashinferPrefillKernels

WORKSPACE_BYTES = 128 * 1024 * 1024  # flashinfer's recommended float workspace (split-k partials)
TENSOR_CORE_MIN_GROUP = 4  # GQA group at which flashinfer's tensor-core decode wins (as sglang)
# The prefill wrapper's `backend` (flashinfer 0.7.4 prefill.py). "auto" resolves at every plan():
# FA3 on sm90 for head dims 64/128 unless the step's longest query is <= 64 tokens. The decode
# wrappers need no choice: bf16 tensor-core decode always runs FA2 there (FA3 only for fp8).
PREFILL_KERNELS = get_args(FlashinferPrefillKernels)


def unsupported_options(window: int | None, softcap: float | None) -> str:
    what = [n for n, v in (("sliding windows", window), ("attention soft-capping", softcap)) if v is not None]
    joined = " and ".join(what)
    return f"the flashinfer attention backend does not support {joined} yet; use attention.backend: torch"


class FlashInferAttentionBackend(AttentionBackend):
    name = "flashinfer"
    supports_cuda_graphs = True  # forward is capturable once begin_step has planned the step

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        *,
        sm_scale: float | None = None,
        graph_batch_sizes: Sequence[int] = (),
        max_blocks_per_seq: int = 0,
        workspace_bytes: int | None = None,  # None = WORKSPACE_BYTES
        prefill_backend: str = "fa2",  # flashinfer's prefill kernels: fa2 | fa3 | auto
        kv_dtype: torch.dtype | None = None,  # the pool's storage; None = `dtype`
    ) -> None:
        if prefill_backend not in PREFILL_KERNELS:
            raise ValueError(
                f"prefill_backend must be one of {', '.join(PREFILL_KERNELS)}, got {prefill_backend!r}"
            )
        import flashinfer

        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.block_size, self.dtype, self.device = block_size, dtype, torch.device(device)
        self.kv_dtype = dtype if kv_dtype is None else kv_dtype
        if self.kv_dtype == torch.int8:
            raise ValueError("the flashinfer attention backend reads no int8 KV cache (use fp8_e4m3)")
        self.sm_scale = head_dim**-0.5 if sm_scale is None else sm_scale
        self.tensor_cores = num_heads // num_kv_heads >= TENSOR_CORE_MIN_GROUP
        # zeroed: flashinfer requires it before first use; one workspace for every wrapper
        nbytes = WORKSPACE_BYTES if workspace_bytes is None else workspace_bytes
        self._workspace = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        self.prefill_backend = prefill_backend
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", backend=prefill_backend
        )
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_tensor_cores=self.tensor_cores
        )
        self._graph_decode = self._graph_wrappers(flashinfer, graph_batch_sizes, max_blocks_per_seq)
        # (rows, Q) -> prefill wrapper of verify steps (begin_verify)
        self._graph_verify: dict[tuple[int, int], Any] = {}
        self._active: Any = None  # the wrapper planned for this step
        # CUDA: plan() stages its schedule in pinned memory, copied to the device asynchronously
        self._staging = PlanStaging() if self.device.type == "cuda" else None
        self._op = register_attention_op(self)

    def _graph_wrappers(
        self, flashinfer: Any, sizes: Sequence[int], max_blocks_per_seq: int
    ) -> dict[int, Any]:
        if not sizes:
            return {}
        if max_blocks_per_seq < 1:
            raise ValueError(
                "graph_batch_sizes needs max_blocks_per_seq >= 1 (to size the page-index buffer)"
            )
        rows = max(sizes)
        self._indptr_buf = torch.zeros(rows + 1, dtype=torch.int32, device=self.device)
        self._indices_buf = torch.zeros(rows * max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self._last_page_buf = torch.ones(rows, dtype=torch.int32, device=self.device)
        return {
            n: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=self.tensor_cores,
                paged_kv_indptr_buffer=self._indptr_buf[: n + 1],
                paged_kv_indices_buffer=self._indices_buf,
                paged_kv_last_page_len_buffer=self._last_page_buf[:n],
            )
            for n in sorted(set(sizes))
        }

    def begin_step(self, meta: AttentionMetadata) -> None:
        # -1 (a padding convention of other callers) -> the dummy slot 0, once per step here
        # rather than in every layer's op (30 more kernels per step in a 30-layer graph)
        meta.slot_mapping.clamp_(min=0)
        kv_indptr, last_page_len, pages = paged_kv_host(meta.seq_lens_cpu, meta.block_size)
        indices = page_indices(meta.block_tables, kv_indptr, pages)
        common: dict[str, Any] = {
            "sm_scale": self.sm_scale,
            "q_data_type": self.dtype,
            "kv_data_type": self.kv_dtype,
        }
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, meta.block_size)
        if meta.is_decode_only:
            wrapper = self._graph_decode.get(meta.num_seqs, self._decode)
            self._plan(
                wrapper,
                lambda: wrapper.plan(
                    kv_indptr, indices, last_page_len, *heads, pos_encoding_mode="NONE", **common
                ),
            )
        else:
            wrapper = self._prefill
            qo = qo_indptr_host(meta.query_lens_cpu)
            self._plan(
                wrapper,
                lambda: wrapper.plan(qo, kv_indptr, indices, last_page_len, *heads, causal=True, **common),
            )
        self._active = wrapper

    def _plan(self, wrapper: Any, run_plan: Callable[[], None]) -> None:
        """plan() on a staging buffer whose previous copy has run (plan_staging.py)."""
        if self._staging is None:
            run_plan()
        else:
            self._staging.plan(wrapper, run_plan)

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: StepMetadata,  # reads slot_mapping; begin_step planned the rest
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
        scales: tuple[torch.Tensor, torch.Tensor] | None = None,  # never set: no int8 pool here
    ) -> torch.Tensor:  # [T, Hq, D]
        if scales is not None:
            raise ValueError("the flashinfer attention backend reads no int8 KV cache (use fp8_e4m3)")
        if window is not None or softcap is not None:
            # one plan() per step serves every layer; sliding and global layers would need two
            raise ValueError(unsupported_options(window, softcap))
        if abs(scale - self.sm_scale) > 1e-6 * self.sm_scale:
            raise ValueError(f"flashinfer backend planned sm_scale {self.sm_scale}, forward got {scale}")
        # a verify step's slots are [rows, Q]
        return self._op(q.contiguous(), k, v, k_cache, v_cache, meta.slot_mapping.reshape(-1))

    def begin_verify(self, batch: Any, block_size: int) -> None:
        """Plans a speculative verify step in the padded layout (graphs/interface.py VerifyBatch:
        n rows of Q queries, causal). Row r's KV length is planned as seq_len - query_len + Q, so
        that with flashinfer's bottom-right aligned causal mask its real queries see exactly their
        context, and its padding queries (outputs unused, K/V written to the dummy slot) see stale
        slots past it. Each (rows, Q) gets a CUDA-graph prefill wrapper of its own (fixed buffers,
        planned here before each replay): flashinfer latches a graph-mode wrapper's query-row count
        at its first plan() and refuses more later. Run on an H200 (bench/gpu/GPU.md, (e)-(g))."""
        n, nq = batch.input_ids.shape
        width = batch.block_tables.shape[1]
        lens = [
            min(s - ql + nq, width * block_size)
            for s, ql in zip(batch.seq_lens_cpu, batch.query_lens_cpu, strict=True)
        ]
        kv_indptr, last_page_len, pages = paged_kv_host(lens, block_size)
        indices = page_indices(batch.block_tables, kv_indptr, pages)
        qo = torch.arange(0, (n + 1) * nq, nq, dtype=torch.int32)
        wrapper = self._verify_wrapper(n, nq, width)
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, block_size)
        common = {"sm_scale": self.sm_scale, "q_data_type": self.dtype, "kv_data_type": self.kv_dtype}
        self._plan(
            wrapper,
            lambda: wrapper.plan(qo, kv_indptr, indices, last_page_len, *heads, causal=True, **common),
        )
        self._active = wrapper

    def _verify_wrapper(self, rows: int, queries: int, width: int) -> Any:
        """The CUDA-graph prefill wrapper for verify steps of `rows` rows of `queries` queries
        (made on first use)."""
        wrappers = self._graph_verify
        wrapper = wrappers.get((rows, queries))
        if wrapper is None:
            import flashinfer

            wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=torch.zeros(rows + 1, dtype=torch.int32, device=self.device),
                paged_kv_indptr_buf=torch.zeros(rows + 1, dtype=torch.int32, device=self.device),
                paged_kv_indices_buf=torch.zeros(rows * width, dtype=torch.int32, device=self.device),
                paged_kv_last_page_len_buf=torch.ones(rows, dtype=torch.int32, device=self.device),
                backend=self.prefill_backend,
            )
            wrappers[rows, queries] = wrapper
        return wrapper

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """The op's body (eager, also while being captured): write K/V, run the planned wrapper."""
        if self._active is None:
            raise RuntimeError("flashinfer backend: forward before begin_step() planned the step")
        # slot_mapping >= 0: begin_step clamped it
        # encode: the cast of the pool's dtype (fp8: clamped first, an overflow would be NaN)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, encode(k, k_cache.dtype)[0])
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, encode(v, v_cache.dtype)[0])
        # forward passed q contiguous; a compiler could in principle hand the op another layout
        out: torch.Tensor = self._active.run(q.contiguous(), (k_cache, v_cache))
        return out
