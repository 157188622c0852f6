"""Loading a GGUF checkpoint: architecture and weights under Hugging Face parameter names.

(The tokenizer in the same file is core/tokenizer/tokenizer.py's: `Tokenizer.from_gguf(path)`.)

Tensors are dequantized (core/loaders/dequant.py, bit-identical to `gguf.quants.dequantize`) and handed
out one at a time in the requested dtype. Names, metadata and what llama.cpp's converter changed
(Llama's permuted Q and K rows, Gemma's 1 + w norms) are core/loaders/gguf_arch.py's: the weights
equal `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`'s.

With the cache on, the first load also stores the converted tensors (and the architecture) in a
safetensors file (core/loaders/weights_cache.py); later loads read that instead of the GGUF.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from rillet.core.loaders.dequant import FAST_TYPES, dequantize
from rillet.core.loaders.gguf_arch import arch_from_gguf, convert_values, expected_names, hf_name, is_ignored
from rillet.core.loaders.gguf_file import GGUFFile, GGUFTensorInfo, read_gguf
from rillet.core.loaders.weights_cache import cache_file, default_cache_dir, read_cache, write_cache
from rillet.core.model.arch import ModelArch

log = logging.getLogger(__name__)


def _convert(gguf: GGUFFile, t: GGUFTensorInfo, arch: ModelArch, dtype: torch.dtype) -> torch.Tensor:
    values = dequantize(gguf.raw(t), t.ggml_type, t.shape)  # a new float32 array
    src = torch.from_numpy(convert_values(gguf.architecture, t.name, values, arch))
    return src if dtype == torch.float32 else src.to(dtype)


def iter_gguf_weights(
    gguf: GGUFFile, arch: ModelArch, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(hf_name, tensor)` for every tensor the model needs, in file order; raises if one is missing."""
    check_complete(gguf, arch)
    for t in gguf.tensors:
        name = hf_name(t.name, gguf.architecture)
        if name is None:
            if not is_ignored(t.name):
                log.warning("ignoring GGUF tensor %s", t.name)
            continue
        yield name, _convert(gguf, t, arch, dtype)


def check_complete(gguf: GGUFFile, arch: ModelArch) -> None:
    present = {hf_name(t.name, gguf.architecture) for t in gguf.tensors}
    missing = [n for n in expected_names(arch) if n not in present]
    if missing:
        raise ValueError(f"GGUF file lacks {len(missing)} tensors the model needs, e.g. {missing[:3]}")


def load_gguf(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | Path | None = None,
    use_cache: bool | None = None,
    header: GGUFFile | None = None,
) -> tuple[ModelArch, Iterator[tuple[str, torch.Tensor]]]:
    """-> (architecture, single-pass iterator of (HF name, tensor in `dtype`)), in file order.

    `cache_dir` None = ~/.cache/rillet. A cache hit never opens the GGUF file. `use_cache`:
    True / False; None (auto) reads an existing entry but writes one only when the file holds a
    tensor type that core/loaders/dequant.py leaves to gguf's slow numpy path (K-quants, ...): for the
    fast types, converting (~0.6 s CPU for SmolLM2-135M) costs about what reading the cache
    does, so a cache would only spend disk (540 MB in float32). `header`: the file already parsed
    by the caller (read_gguf), so it is not parsed twice.
    """
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype {dtype} is not supported (float32, bfloat16, float16)")
    source = Path(path)
    entry_path = cache_file(Path(cache_dir).expanduser() if cache_dir else default_cache_dir(), source, dtype)
    entry = read_cache(entry_path) if use_cache is not False else None
    if entry is not None:
        try:
            arch = ModelArch.from_json(entry.metadata["arch"])
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("weights cache %s has bad metadata (%s); converting again", entry_path, exc)
            entry_path.unlink(missing_ok=True)
        else:
            log.info("loading %s from the weights cache %s", source.name, entry_path)
            return arch, entry.tensors()
    gguf = header if header is not None else read_gguf(source)
    arch = arch_from_gguf(gguf)
    weights = iter_gguf_weights(gguf, arch, dtype)
    if use_cache is None:
        use_cache = any(t.ggml_type not in FAST_TYPES for t in gguf.tensors)
    if use_cache:
        weights = _caching(weights, entry_path, {"arch": arch.to_json(), "source": str(source)})
    return arch, weights


def _caching(
    weights: Iterator[tuple[str, torch.Tensor]], path: Path, metadata: dict[str, str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Passes `weights` through; once all were taken, writes them to the cache (not if stopped early).

    The tensors handed out are the ones stored: a consumer copies them (as `load_weights` does);
    modifying one in place before the iteration ends would store the modified values.
    """
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        kept[name] = tensor
        yield name, tensor
    write_cache(path, kept, metadata)
