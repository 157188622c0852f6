"""M-RoPE positions of a Qwen2-VL prompt (transformers' `get_rope_index`): text tokens count on
in all three streams; an image's tokens take (t, h, w) = (start, start + row, start + column)
over its merged grid, and the text after it starts at start + max(rows, columns)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rillet.core.vision.payload import MmItem


def mrope_positions(length: int, items: Sequence[MmItem], merge: int) -> tuple[np.ndarray, int]:
    """-> (positions [3, length] int64, rope delta: max position + 1 - length)."""
    pos = np.empty((3, length), dtype=np.int64)
    cur, at = 0, 0
    for it in items:  # in prompt order
        n = it.offset - at
        pos[:, at : it.offset] = np.arange(cur, cur + n)
        cur += n
        _, gh, gw = it.grid
        rows, cols = gh // merge, gw // merge
        pos[0, it.offset : it.end] = cur
        pos[1, it.offset : it.end] = cur + np.repeat(np.arange(rows), cols)
        pos[2, it.offset : it.end] = cur + np.tile(np.arange(cols), rows)
        cur += max(rows, cols)
        at = it.end
    pos[:, at:] = np.arange(cur, cur + length - at)
    top = int(pos.max()) if length else -1
    return pos, top + 1 - length
