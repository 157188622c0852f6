"""Attention backend selection: every branch, its fallback and its message (importability faked)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types

import pytest
import torch
from rillet.core.attention import select as sel
from rillet.core.config import AttentionConfig, ConfigError
from rillet.core.model.arch import ModelArch

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
NO_FI = "ModuleNotFoundError: No module named 'flashinfer'"
NO_XF = "NotImplementedError: No operator found for `memory_efficient_attention_forward`"


def _fake(monkeypatch: pytest.MonkeyPatch, flashinfer: str | None, xformers: str | None = NO_XF) -> None:
    monkeypatch.setattr(sel, "probe_flashinfer", lambda: flashinfer)
    monkeypatch.setattr(sel, "probe_xformers", lambda device: xformers)


def _select(
    backend: str = "auto", prefill: str = "auto", device: torch.device = CPU
) -> sel.AttentionSelection:
    return sel.select_attention_backend(AttentionConfig(backend=backend, prefill_backend=prefill), device)  # type: ignore[arg-type]


def test_cpu_auto_is_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=None)  # even an importable flashinfer is not used on CPU
    s = _select()
    assert (s.backend, s.prefill_backend) == ("torch", "torch")
    assert "attention: auto -> torch (device is cpu; flashinfer needs CUDA)" in s.log_lines
    assert s.log_lines[-1] == "attention: decode backend torch, prefill backend torch (device cpu)"


def test_cuda_auto_prefers_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=None)
    s = _select(device=CUDA)
    assert (s.backend, s.prefill_backend) == ("flashinfer", "flashinfer")
    assert "attention: auto -> flashinfer (CUDA, flashinfer importable)" in s.log_lines


def test_cuda_auto_without_flashinfer_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=NO_FI)
    s = _select(device=CUDA)
    assert (s.backend, s.prefill_backend) == ("torch", "torch")
    assert f"attention: auto -> torch (flashinfer is not importable: {NO_FI})" in s.log_lines


def test_explicit_torch_is_kept_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=None)
    for device in (CPU, CUDA):
        s = _select("torch", "torch", device)
        assert (s.backend, s.prefill_backend) == ("torch", "torch")
        assert len(s.log_lines) == 1  # only the summary: nothing was decided automatically


def test_explicit_flashinfer_on_cpu_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=None)
    with pytest.raises(ConfigError, match="'flashinfer' needs a CUDA device, the model runs on cpu") as err:
        _select("flashinfer")
    assert err.value.key == "attention.backend"
    with pytest.raises(ConfigError) as err:
        _select("torch", "flashinfer")
    assert err.value.key == "attention.prefill_backend"


def test_explicit_flashinfer_not_importable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=NO_FI)
    with pytest.raises(ConfigError, match="is not importable") as err:
        _select("flashinfer", device=CUDA)
    assert err.value.key == "attention.backend" and NO_FI in str(err.value)


def test_mixed_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=None)
    s = _select("flashinfer", "torch", CUDA)
    assert (s.backend, s.prefill_backend) == ("flashinfer", "torch")
    s = _select("torch", "flashinfer", CUDA)
    assert (s.backend, s.prefill_backend) == ("torch", "flashinfer")


def test_xformers_prefill_falls_back_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=None, xformers=NO_XF)
    s = _select(prefill="xformers", device=CUDA)
    assert (s.backend, s.prefill_backend) == ("flashinfer", "flashinfer")
    assert f"attention: prefill xformers unusable ({NO_XF}); prefill uses flashinfer" in s.log_lines
    s = _select(prefill="xformers", device=CPU)
    assert s.prefill_backend == "torch"
    assert f"attention: prefill xformers unusable ({NO_XF}); prefill uses torch" in s.log_lines


def test_xformers_prefill_when_it_works(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, flashinfer=None, xformers=None)
    s = _select(prefill="xformers", device=CUDA)
    assert (s.backend, s.prefill_backend) == ("flashinfer", "xformers")


def test_xformers_probe_runs_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """An xformers that imports but has no kernel for the device (the registry build on the GPU
    image) is caught by the probe, with the error's first line as the reason."""
    calls: list[tuple[int, ...]] = []

    def no_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(q.shape))
        raise NotImplementedError("No operator found for `memory_efficient_attention_forward`\n  details...")

    ops = types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = no_kernel  # type: ignore[attr-defined]
    pkg = types.ModuleType("xformers")
    pkg.ops = ops  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "xformers", pkg)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)
    assert sel.probe_xformers(CPU) == NO_XF
    assert calls == [(1, 8, 2, 64)]
    ops.memory_efficient_attention = lambda q, k, v: q  # type: ignore[attr-defined]
    assert sel.probe_xformers(CPU) is None


def test_flashinfer_probe_reports_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    why = sel.probe_flashinfer()
    assert why is not None and why.startswith("ModuleNotFoundError: ")
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    assert sel.probe_flashinfer() is None


def test_flashinfer_module_imports_without_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.delitem(sys.modules, "rillet.core.attention.flashinfer_backend", raising=False)
    mod = importlib.import_module("rillet.core.attention.flashinfer_backend")
    assert mod.FlashInferAttentionBackend.name == "flashinfer"


ARCH = ModelArch(
    vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=4
)


def test_create_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    from rillet.core.attention.torch_backend import TorchAttentionBackend

    torch_backend = sel.create_attention_backend(
        "torch", ARCH, block_size=16, dtype=torch.float32, device=CPU
    )
    assert isinstance(torch_backend, TorchAttentionBackend)
    with pytest.raises(ValueError, match="no attention backend named 'xformers'"):
        sel.create_attention_backend("xformers", ARCH, block_size=16, dtype=torch.float32, device=CPU)
    made: list[dict[str, object]] = []

    class Wrapper:
        def __init__(self, *args: object, **kwargs: object) -> None:
            made.append(kwargs)

    fi = types.ModuleType("flashinfer")
    fi.BatchPrefillWithPagedKVCacheWrapper = Wrapper  # type: ignore[attr-defined]
    fi.BatchDecodeWithPagedKVCacheWrapper = Wrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setattr("rillet.core.attention.flashinfer_backend.WORKSPACE_BYTES", 1024)
    backend = sel.create_attention_backend(
        "flashinfer",
        ARCH,
        block_size=16,
        dtype=torch.float32,
        device=CPU,
        graph_batch_sizes=(1, 2),
        max_blocks_per_seq=8,
    )
    assert backend.name == "flashinfer" and backend.num_heads == 4 and backend.num_kv_heads == 2  # type: ignore[attr-defined]
    assert sum(1 for kw in made if kw.get("use_cuda_graph")) == 2  # one graph decode wrapper per bucket


GEMMA = dataclasses.replace(
    ARCH,
    architecture="gemma2",
    sliding_window=4,
    sliding_layers=(0,),
    attn_softcap=50.0,
    query_pre_attn_scalar=8,
)


def test_models_flashinfer_cannot_run_get_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sliding windows and soft-capping are not wired into flashinfer: auto picks torch on CUDA
    for such a model (saying why), an explicit flashinfer is a config error naming the key."""
    _fake(monkeypatch, flashinfer=None)
    s = sel.select_attention_backend(AttentionConfig(), CUDA, GEMMA)
    assert (s.backend, s.prefill_backend) == ("torch", "torch")
    assert (
        "attention: auto -> torch (flashinfer does not support sliding windows and soft-capping (gemma2) yet)"
        in s.log_lines
    )
    assert sel.select_attention_backend(AttentionConfig(), CUDA, ARCH).backend == "flashinfer"
    with pytest.raises(
        ConfigError, match=r"'attention\.backend': .*sliding windows and soft-capping \(gemma2\)"
    ):
        sel.select_attention_backend(AttentionConfig(backend="flashinfer"), CUDA, GEMMA)


def test_flashinfer_takes_the_query_scale_and_refuses_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    class Wrapper:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

    fi = types.ModuleType("flashinfer")
    fi.BatchPrefillWithPagedKVCacheWrapper = Wrapper  # type: ignore[attr-defined]
    fi.BatchDecodeWithPagedKVCacheWrapper = Wrapper  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setattr("rillet.core.attention.flashinfer_backend.WORKSPACE_BYTES", 1024)
    backend = sel.create_attention_backend(
        "flashinfer", GEMMA, block_size=16, dtype=torch.float32, device=CPU
    )
    assert backend.sm_scale == pytest.approx(8**-0.5)  # type: ignore[attr-defined]
    x = torch.zeros(1, 4, 4)
    with pytest.raises(
        ValueError, match=r"does not support sliding windows yet; use attention\.backend: torch"
    ):
        backend.forward(x, x, x, x, x, None, 8**-0.5, window=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not support attention soft-capping yet"):
        backend.forward(x, x, x, x, x, None, 8**-0.5, softcap=50.0)  # type: ignore[arg-type]
