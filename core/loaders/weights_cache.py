"""A disk cache of converted weights (one safetensors file per source file and dtype).

Dequantizing a GGUF and parsing its metadata costs seconds; reading the converted tensors back
is a memory copy. An entry is keyed by the source's resolved path, size, mtime and the dtype, so
an edited or replaced file misses. Entries are written to a temporary file and renamed into place,
so a reader never sees a partial file; one that is unreadable anyway (truncated by a full disk,
foreign, an older format) is deleted and reported as a miss.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

log = logging.getLogger(__name__)

CACHE_FORMAT = "rillet-weights-1"  # bump when the layout or the conversion changes


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rillet"


def cache_file(cache_dir: Path, source: Path, dtype: torch.dtype) -> Path:
    st = source.stat()
    dtype_name = str(dtype).removeprefix("torch.")
    ident = f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}|{dtype_name}|{CACHE_FORMAT}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return cache_dir / f"{source.stem}.{dtype_name}.{digest}.safetensors"


class CacheEntry:
    """An open, validated cache file. `metadata` is what was stored with it; tensors load lazily."""

    def __init__(self, path: Path, metadata: dict[str, str], names: list[str]) -> None:
        self.path = path
        self.metadata = metadata
        self.names = names

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """In the order they were stored. Each is backed by a private copy-on-write mapping of the
        file (pages load on first touch): writing to it never reaches the file, and entries are
        only ever replaced by rename, so the mapping stays valid."""
        with safe_open(str(self.path), framework="pt") as f:
            for name in self.names:
                yield name, f.get_tensor(name)


def read_cache(path: Path) -> CacheEntry | None:
    """The entry at `path`, or None on a miss; a corrupt entry is removed (and is a miss)."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
            stored = set(f.keys())
        if metadata.get("format") != CACHE_FORMAT:
            raise ValueError(f"format {metadata.get('format')!r}")
        names = json.loads(metadata["names"])
        if not isinstance(names, list) or set(names) != stored:
            raise ValueError("tensor list does not match the file")
    except Exception as exc:  # any unreadable entry: safetensors raises its own error types
        log.warning("weights cache %s is unreadable (%s); converting again", path, exc)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    return CacheEntry(path, metadata, names)


def write_cache(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bool:
    """Atomically stores `tensors` (in their mapping order); False (logged) if it could not be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    meta = {**metadata, "format": CACHE_FORMAT, "names": json.dumps(list(tensors))}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(dict(tensors), str(tmp), metadata=meta)
        os.replace(tmp, path)
    except OSError as exc:  # read-only or full disk: loading still succeeds, uncached
        log.warning("could not write weights cache %s: %s", path, exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True
