"""Reading only a rank's shard of each weight, as it is read: no rank ever holds the whole model.

GGUF: a 2-D tensor's rows are contiguous in the file with their quantization blocks inside each
row, so a row shard (column-parallel) is a byte range per row set that is dequantized alone; a
column shard (row-parallel) is a byte range inside every row when its bounds fall on block
boundaries (always for 32-element blocks and 32-aligned shards), else the tensor is dequantized
one weight at a time and sliced. Safetensors: `get_slice` reads just the shard's bytes.
The converted-weights cache of core/loaders/gguf.py is not used here (it stores whole tensors).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from rillet.core.build import make_backend, maybe_quantize
from rillet.core.config import RilletConfig
from rillet.core.distributed.plan import ShardPlan, ShardSpec
from rillet.core.loaders.dequant import dequantize
from rillet.core.loaders.gguf import _permuted_heads, arch_from_gguf, expected_names, hf_name
from rillet.core.loaders.gguf_file import GGUFFile, GGUFTensorInfo, read_gguf
from rillet.core.loaders.hf import find_hf_folder, load_hf_folder
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel, build_model
from rillet.core.model.shapes import shape_arch
from rillet.core.quant.select import Quantization
from safetensors import safe_open


def read_arch(cfg: RilletConfig, kind: str, path: Path | None, header: GGUFFile | None) -> ModelArch:
    """The whole model's architecture, without reading any weight."""
    if kind == "shape":
        return shape_arch(cfg.model.shape)
    assert path is not None
    if kind == "gguf":
        return arch_from_gguf(header if header is not None else read_gguf(path))
    arch, _ = load_hf_folder(path)  # the weight iterator is lazy: nothing is read
    return arch


def load_shard(
    cfg: RilletConfig,
    kind: str,
    path: Path | None,
    header: GGUFFile | None,
    device: torch.device,
    dtype: torch.dtype,
    quantization: Quantization,
    plan: ShardPlan,
) -> DecoderModel:
    """This rank's model: the local architecture (its heads, its intermediate rows), its weights."""
    local = plan.local_arch()
    backend = make_backend(cfg, local, device, dtype)
    model = build_model(local, backend, dtype, device, cfg.model.max_model_len)
    if kind == "shape":  # random weights per shard: the same shapes and bytes, not TP=1's values
        model.init_random(cfg.model.seed + plan.rank)
    elif kind == "gguf":
        assert path is not None
        gguf = header if header is not None else read_gguf(path)
        model.load_weights(iter_gguf_shard(gguf, plan, dtype))
    else:
        assert path is not None
        model.load_weights(iter_safetensors_shard(find_hf_folder(path).weight_files, plan, dtype))
    maybe_quantize(quantization, model)
    if not plan.keeps_lm_head:
        model.quant_head = None  # quantize_int4 made a head from the embedding: never used here
    return model


def iter_safetensors_shard(
    files: tuple[Path, ...], plan: ShardPlan, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                if not plan.wanted(name):
                    continue
                spec = plan.spec(name)
                if spec is None:
                    t = st.get_tensor(name)
                else:
                    part = st.get_slice(name)
                    t = part[spec.start : spec.stop] if spec.dim == 0 else part[:, spec.start : spec.stop]
                yield name, (t.to(dtype) if t.is_floating_point() else t)


def iter_gguf_shard(
    gguf: GGUFFile, plan: ShardPlan, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(hf_name, shard)` for every tensor this rank needs, in file order."""
    present = {hf_name(t.name) for t in gguf.tensors}
    missing = [n for n in expected_names(plan.arch) if n not in present]
    if missing:
        raise ValueError(f"GGUF file lacks {len(missing)} tensors the model needs, e.g. {missing[:3]}")
    for t in gguf.tensors:
        name = hf_name(t.name)
        if name is None or not plan.wanted(name):
            continue
        values = _dequantize_shard(gguf, t, plan.spec(name))
        heads = _permuted_heads(t.name, plan.arch)
        if heads is not None:
            # undo llama.cpp's rotary row order per head, as core/loaders/gguf.py does; a row shard
            # holds whole heads, so the same per-head permutation applies to it
            rows = values.shape[0]
            half = plan.arch.head_dim // 2
            values = values.reshape(rows // (2 * half), half, 2, -1).swapaxes(1, 2).reshape(rows, -1)
            if len(t.shape) == 1:
                values = values.reshape(rows)
        src = torch.from_numpy(np.ascontiguousarray(values))
        yield name, (src if dtype == torch.float32 else src.to(dtype))


def _dequantize_shard(gguf: GGUFFile, t: GGUFTensorInfo, spec: ShardSpec | None) -> np.ndarray:
    raw = gguf.raw(t)
    if spec is None or len(t.shape) != 2:
        values = dequantize(raw, t.ggml_type, t.shape)
        if spec is None:
            return values
        return values[spec.start : spec.stop].copy()  # a 1-D bias: small, sliced after
    rows, cols = t.shape
    per_row = raw.reshape(rows, -1)
    if spec.dim == 0:
        part = per_row[spec.start : spec.stop]
        return dequantize(np.ascontiguousarray(part).reshape(-1), t.ggml_type, (len(part), cols))
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
    if spec.start % block or spec.stop % block:
        return dequantize(raw, t.ggml_type, t.shape)[:, spec.start : spec.stop].copy()
    part = per_row[:, spec.start // block * size : spec.stop // block * size]
    return dequantize(np.ascontiguousarray(part).reshape(-1), t.ggml_type, (rows, spec.stop - spec.start))
