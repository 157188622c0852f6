"""Reading only a rank's shard of each weight, as it is read: no rank ever holds the whole model.

GGUF: a tensor's rows are contiguous in the file with their quantization blocks inside each row,
so a row shard (column-parallel) is a byte range per row set that is dequantized alone; a column
shard (row-parallel) is a byte range inside every row when its bounds fall on block boundaries
(always for 32-element blocks and 32-aligned shards), else the rows are dequantized and sliced.
Stacked experts ([E, rows, cols]) and fused projections (Phi-3's qkv) are read per canonical part
(core/model/weights.py), each part's shard alone. Safetensors: `get_slice` reads just the shard.
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
from rillet.core.distributed.plan import ShardPlan, compose
from rillet.core.loaders.dequant import dequantize
from rillet.core.loaders.gguf import check_complete
from rillet.core.loaders.gguf_arch import arch_from_gguf, convert_values, hf_name
from rillet.core.loaders.gguf_file import GGUFFile, GGUFTensorInfo, read_gguf
from rillet.core.loaders.hf import find_hf_folder, load_hf_folder
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel, build_model
from rillet.core.model.shapes import shape_arch
from rillet.core.model.weights import canonical_parts
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
    """`(canonical name, shard)` for every tensor this rank needs (fused and stacked file tensors
    are read part by part, each part's shard only)."""
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                part = st.get_slice(name)
                shape = tuple(part.get_shape())
                for canon, index in canonical_parts(name, shape, plan.arch):
                    if not plan.wanted(canon):
                        continue
                    full = compose(index, len(shape), plan.spec(canon))
                    t = part[full] if full else st.get_tensor(name)
                    yield canon, (t.to(dtype) if t.is_floating_point() else t)


def iter_gguf_shard(
    gguf: GGUFFile, plan: ShardPlan, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """`(canonical name, shard)` for every tensor this rank needs, in file order."""
    check_complete(gguf, plan.arch)
    for t in gguf.tensors:
        name = hf_name(t.name, gguf.architecture)
        if name is None:
            continue
        for canon, index in canonical_parts(name, t.shape, plan.arch):
            if not plan.wanted(canon):
                continue
            values = _dequantize_index(gguf, t, compose(index, len(t.shape), plan.spec(canon)))
            # undo the converter's changes: a row shard of q/k holds whole heads, so the per-head
            # permutation applies to it as to the whole tensor
            values = convert_values(gguf.architecture, t.name, values, plan.arch)
            src = torch.from_numpy(np.ascontiguousarray(values))
            yield canon, (src if dtype == torch.float32 else src.to(dtype))


def _dequantize_index(gguf: GGUFFile, t: GGUFTensorInfo, index: tuple[int | slice, ...]) -> np.ndarray:
    """t[index] dequantized, reading only its bytes: quantization blocks run along the last dim,
    so any index of the leading dims is a choice of whole rows, and a column range on block
    boundaries a byte range inside each row (else the rows are dequantized whole and sliced)."""
    *lead_shape, cols = t.shape
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
    rows = gguf.raw(t).reshape(*lead_shape, cols // block * size)[index[:-1]]
    last = index[-1]
    assert isinstance(last, slice)
    lo, hi = last.start or 0, cols if last.stop is None else last.stop
    if (lo, hi) != (0, cols) and (lo % block or hi % block):
        values = dequantize(np.ascontiguousarray(rows).reshape(-1), t.ggml_type, (*rows.shape[:-1], cols))
        return values[..., lo:hi].copy()
    part = rows[..., lo // block * size : hi // block * size]
    return dequantize(np.ascontiguousarray(part).reshape(-1), t.ggml_type, (*part.shape[:-1], hi - lo))
