"""Reading a GGUF file's header: metadata as plain Python values, and where each tensor lives.

`gguf.GGUFReader` builds a numpy memmap view per metadata element; on a 49k-token vocabulary that
takes 2-4 s here. This parser reads the same layout with `struct` in ~0.1 s and leaves the tensor
data memory-mapped until it is dequantized (core/loaders/dequant.py). No torch here: the tokenizer reads
the metadata too.

Layout (GGUF v2/v3, little-endian): magic, version u32, tensor count u64, kv count u64; kv pairs
(key string, type u32, value); tensor infos (name, n_dims u32, dims u64 * n_dims fastest-moving
first, ggml type u32, offset u64 into the data section); data section at the next multiple of
`general.alignment` (default 32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (slowest-moving first), the reverse of ggml's `ne`
    ggml_type: int
    offset: int  # absolute, in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensorInfo, ...]
    data: np.ndarray  # the whole file, uint8, a copy-on-write memory map (writes never reach the file)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture"))

    def raw(self, t: GGUFTensorInfo) -> np.ndarray:
        """The tensor's stored bytes, uint8 [nbytes]."""
        return self.data[t.offset : t.offset + t.nbytes]


class _Cursor:
    def __init__(self, buf: np.ndarray) -> None:
        self.buf = memoryview(buf)  # type: ignore[arg-type]  # uint8 ndarray exports the buffer protocol
        self.pos = 0

    def scalar(self, kind: int) -> Any:
        fmt = "<" + _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar(10)
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.pos}")
        return self.scalar(kind)

    def array(self) -> list[Any]:
        kind, count = self.scalar(4), self.scalar(10)
        if kind in _SCALARS:  # token types, scores: one numpy read instead of a Python loop
            dt = np.dtype("<" + _SCALARS[kind])  # struct codes are numpy codes too
            values = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
            self.pos += count * dt.itemsize
            return values.tolist()  # type: ignore[no-any-return]
        return [self.value(kind) for _ in range(count)]


def read_gguf(path: str | Path) -> GGUFFile:
    """Parses header, metadata and tensor table; raises ValueError for a file that is not GGUF."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        # Copy-on-write, so torch can wrap tensor bytes without a read-only warning; a plain
        # ndarray view, because memmap's Python-level slicing hooks cost seconds over many slices.
        data = np.memmap(path, dtype=np.uint8, mode="c").view(np.ndarray)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    cur = _Cursor(data)
    if len(data) < 24 or bytes(data[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (bad magic)")
    cur.pos = 4
    version = cur.scalar(4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2, 3; little-endian)")
    n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
    try:
        metadata = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar(4))
        entries = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.scalar(10) for _ in range(cur.scalar(4))]
            entries.append((name, tuple(reversed(dims)), cur.scalar(4), cur.scalar(10)))
    except (struct.error, IndexError, OverflowError, MemoryError, UnicodeDecodeError) as exc:
        # counts or lengths past what the file (or memory) can hold: a corrupt header, not a crash
        raise ValueError(f"{path}: truncated or corrupt GGUF header ({type(exc).__name__}: {exc})") from exc
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or not 1 <= align <= 1 << 20:
        raise ValueError(f"{path}: corrupt GGUF header (general.alignment {align!r})")
    start = (cur.pos + align - 1) // align * align
    tensors = []
    for name, shape, kind, offset in entries:
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise ValueError(f"{path}: tensor {name} has an unknown GGML type {kind}") from None
        nbytes = prod(shape) // block * size
        if start + offset + nbytes > len(data):
            raise ValueError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
        tensors.append(GGUFTensorInfo(name, shape, kind, start + offset, nbytes))
    return GGUFFile(path, metadata, tuple(tensors), data)
