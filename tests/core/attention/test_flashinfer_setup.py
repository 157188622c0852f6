"""FlashInferAttentionBackend's set-up, on the stand-in `flashinfer` module (conftest.py): the
page layout it plans on the host, tensor cores by GQA group, the prefill kernels it is configured
with (also through the config key), and no CUDA-graph decode wrappers without graph batch sizes."""

from __future__ import annotations

import types

import pytest
import torch
from core_helpers.attention_steps import BS, HKV, HQ, D
from core_helpers.attention_steps import backend as _backend
from rillet.core.attention.flashinfer_backend import FlashInferAttentionBackend
from rillet.core.attention.flashinfer_layout import page_indices, paged_kv_host


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


def test_no_graph_sizes_no_graph_wrappers(fake_flashinfer: types.ModuleType) -> None:
    assert _backend()._graph_decode == {}
    with pytest.raises(ValueError, match="max_blocks_per_seq"):
        _backend(graph_batch_sizes=(1, 2))
