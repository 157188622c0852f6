"""GGUF tensor data -> float32 numpy arrays.

The common types (F32, F16, BF16, Q8_0, Q4_0, Q4_1) are unpacked here over the whole tensor at
once: `gguf.quants.dequantize` walks a tensor 16 rows at a time, which costs ~3x more on this
model. The arithmetic is the same IEEE float32 operations in the same order (q * scale, then
+ min, never fused), so the values are bit-identical to gguf's; every other type is delegated to
it. numpy, not torch: single-threaded on purpose, because torch's intra-op threads collapse when
the cores are already busy (measured 10x slower on the shared 2-core box).

Block layouts (ggml-common.h), 32 values per block, scales as float16:
  Q8_0: d, int8 q[32]                         x = q * d
  Q4_0: d, u8 qs[16] (low nibbles = x[0:16])  x = (nibble - 8) * d
  Q4_1: d, m, u8 qs[16]                       x = nibble * d + m
"""

from __future__ import annotations

from math import prod

import numpy as np

F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32 [n_blocks, 1]."""
    return blocks[:, start : start + 2].view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """u8 [n, 16] -> float32 [n, 32]: low nibbles first, then high nibbles."""
    out = np.empty((qs.shape[0], 32), dtype=np.float32)
    np.bitwise_and(qs, np.uint8(0x0F), out=out[:, :16], casting="unsafe")
    np.right_shift(qs, np.uint8(4), out=out[:, 16:], casting="unsafe")
    return out


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    out = blocks[:, 2:].view(np.int8).astype(np.float32)
    out *= _half(blocks, 0)
    return out


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    out = _nibbles(blocks[:, 2:])
    out -= np.float32(8.0)
    out *= _half(blocks, 0)
    return out


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    out = _nibbles(blocks[:, 4:])
    out *= _half(blocks, 0)
    out += _half(blocks, 2)
    return out


_BLOCKED = {Q8_0: (34, _q8_0), Q4_0: (18, _q4_0), Q4_1: (20, _q4_1)}
FAST_TYPES = frozenset({F32, F16, BF16, *_BLOCKED})  # the rest go through gguf's numpy code


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """`raw`: the tensor's stored bytes (uint8, 1-D) -> a new, writable float32 array of `shape`."""
    if ggml_type == F32:
        return raw.view(np.float32).reshape(shape).copy()
    if ggml_type == F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if ggml_type == BF16:  # bfloat16 is the top half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if ggml_type in _BLOCKED:
        size, unpack = _BLOCKED[ggml_type]
        return unpack(raw.reshape(-1, size)).reshape(shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    values = gguf_dequantize(raw.reshape(prod(shape[:-1]), -1), GGMLQuantizationType(ggml_type))
    return np.asarray(values, dtype=np.float32).reshape(shape)
