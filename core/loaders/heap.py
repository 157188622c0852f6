"""Giving freed heap memory back to the OS while a model loads.

The int4 load frees each float32 projection once it is quantized (core/model/weights.py), but
glibc keeps most of what is freed in its heap for reuse (its mmap threshold rises with the first
large free, so later large blocks come from the heap, and a heap shrinks only from its top): the
freed float32 model stayed resident, a load peaked ~260 MB above what `MALLOC_MMAP_THRESHOLD_`
pinned low gave (default model, measured). `malloc_trim(0)` returns every free page of the heap;
it costs a few milliseconds, so it runs once per layer. A no-op where libc is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)


def return_free_memory() -> None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        trim = None
    if trim is not None:
        trim(0)
