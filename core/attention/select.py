"""Chooses the attention backends from config and the device, saying why in log lines.

  attention.backend         auto: flashinfer on CUDA when it imports, else torch; torch on CPU.
                            flashinfer: CUDA and an importable flashinfer, else a ConfigError.
  attention.prefill_backend auto: the decode backend. torch: always. flashinfer: as above.
                            xformers: only when a build imports and a tiny kernel runs on the
                            device (the registry wheel raises NotImplementedError on the GPU image);
                            otherwise the decode backend, with a log line.
  attention.flashinfer_prefill_backend
                            fa2 | fa3 | auto: the kernels flashinfer's prefill wrapper runs.
  cache.dtype int8          flashinfer reads no int8 KV: auto gets torch on CUDA too (its
                            graph-safe decode is captured); flashinfer asked for is a ConfigError.

Backend modules are imported lazily: selecting never imports flashinfer's kernels or the torch
backend's module, and `create_attention_backend` imports only the one it builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from rillet.core.attention.base import AttentionBackend
from rillet.core.config import AttentionConfig, ConfigError
from rillet.core.model.arch import ModelArch


class AttentionSelection(NamedTuple):
    backend: str  # "torch" | "flashinfer": decode, and prefill unless prefill_backend differs
    prefill_backend: str  # "torch" | "flashinfer" | "xformers"
    log_lines: list[str]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def probe_flashinfer() -> str | None:
    """None when flashinfer imports, else why not."""
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # a broken install raises more than ImportError (missing CUDA libs, ABI)
        return _first_line(exc)
    return None


def probe_xformers(device: torch.device) -> str | None:
    """None when xformers imports and its memory-efficient attention runs on `device`, else why not."""
    try:
        import xformers.ops as xops

        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        q = torch.zeros(1, 8, 2, 64, device=device, dtype=dtype)  # [B, M, H, K]
        xops.memory_efficient_attention(q, q, q)
    except Exception as exc:  # ImportError, or NotImplementedError from a build without kernels here
        return _first_line(exc)
    return None


def flashinfer_gap(arch: ModelArch | None) -> str | None:
    """What of `arch`'s attention the flashinfer backend cannot do (None: nothing)."""
    if arch is None:
        return None
    what = [
        n for n, on in (("sliding windows", arch.sliding_layers), ("soft-capping", arch.attn_softcap)) if on
    ]
    return f"{' and '.join(what)} ({arch.architecture})" if what else None


def select_attention_backend(
    cfg: AttentionConfig,
    device: torch.device,
    arch: ModelArch | None = None,
    kv_dtype: torch.dtype | None = None,
) -> AttentionSelection:
    """`arch`: the model, when known: one whose attention flashinfer cannot run gets torch.
    `kv_dtype`: the pool's storage (cache.dtype resolved), when known."""
    lines: list[str] = []
    gap = flashinfer_gap(arch)
    if kv_dtype == torch.int8:
        if "flashinfer" in (cfg.backend, cfg.prefill_backend):
            raise ConfigError(
                "cache.dtype",
                "int8 is read by the torch attention backend only (flashinfer has no int8 KV); "
                "use attention.backend 'auto' or 'torch', or cache.dtype fp8_e4m3 with flashinfer",
            )
        gap = gap or "an int8 KV cache"
    if gap is not None and "flashinfer" in (cfg.backend, cfg.prefill_backend):
        raise ConfigError(
            "attention.backend" if cfg.backend == "flashinfer" else "attention.prefill_backend",
            f"the flashinfer backend does not support {gap} yet; use 'auto' or 'torch'",
        )
    if gap is not None and cfg.backend == "auto" and device.type == "cuda":
        lines.append(f"attention: auto -> torch (flashinfer does not support {gap} yet)")
        backend = "torch"
    else:
        backend = _select_decode(cfg.backend, device, lines)
    prefill = _select_prefill(cfg.prefill_backend, backend, device, lines)
    lines.append(f"attention: decode backend {backend}, prefill backend {prefill} (device {device.type})")
    return AttentionSelection(backend, prefill, lines)


def _select_decode(wanted: str, device: torch.device, lines: list[str]) -> str:
    if wanted == "torch":
        return "torch"
    if wanted == "flashinfer":
        _require_flashinfer("attention.backend", device)
        return "flashinfer"
    if device.type != "cuda":
        lines.append(f"attention: auto -> torch (device is {device.type}; flashinfer needs CUDA)")
        return "torch"
    why = probe_flashinfer()
    if why is not None:
        lines.append(f"attention: auto -> torch (flashinfer is not importable: {why})")
        return "torch"
    lines.append("attention: auto -> flashinfer (CUDA, flashinfer importable)")
    return "flashinfer"


def _select_prefill(wanted: str, backend: str, device: torch.device, lines: list[str]) -> str:
    if wanted == "auto":
        return backend
    if wanted == "torch":
        return "torch"
    if wanted == "flashinfer":
        _require_flashinfer("attention.prefill_backend", device)
        return "flashinfer"
    why = probe_xformers(device)
    if why is not None:
        lines.append(f"attention: prefill xformers unusable ({why}); prefill uses {backend}")
        return backend
    return "xformers"


def _require_flashinfer(key: str, device: torch.device) -> None:
    if device.type != "cuda":
        raise ConfigError(
            key, f"'flashinfer' needs a CUDA device, the model runs on {device.type}; use 'auto' or 'torch'"
        )
    why = probe_flashinfer()
    if why is not None:
        raise ConfigError(
            key, f"'flashinfer' is not importable ({why}); install flashinfer-python or use 'auto'"
        )


def create_attention_backend(
    name: str,
    arch: ModelArch,
    *,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    graph_batch_sizes: Sequence[int] = (),
    max_blocks_per_seq: int = 0,
    flashinfer_prefill_backend: str = "fa2",
    kv_dtype: torch.dtype | None = None,
) -> AttentionBackend:
    """Builds the backend `name` for a model; `graph_batch_sizes` = the captured decode buckets;
    `flashinfer_prefill_backend` = the kernels of flashinfer's prefill wrapper (fa2 | fa3 | auto);
    `kv_dtype` = the pool's storage dtype (None: `dtype`). The torch backend reads any."""
    if name == "torch":
        from rillet.core.attention import cpu_kernel
        from rillet.core.attention.torch_backend import TorchAttentionBackend

        group = arch.num_heads // arch.num_kv_heads
        kernel = cpu_kernel.enabled(arch.head_dim, group, kv_dtype or dtype, device)
        return TorchAttentionBackend(paged_kernel=kernel)
    if name == "flashinfer":
        from rillet.core.attention.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend(
            arch.num_heads,
            arch.num_kv_heads,
            arch.head_dim,
            block_size,
            dtype,
            device,
            sm_scale=arch.attn_scale,
            graph_batch_sizes=graph_batch_sizes,
            max_blocks_per_seq=max_blocks_per_seq,
            prefill_backend=flashinfer_prefill_backend,
            kv_dtype=kv_dtype,
        )
    raise ValueError(f"no attention backend named {name!r} can be built (known: torch, flashinfer)")
