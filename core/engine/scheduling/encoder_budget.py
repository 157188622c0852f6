"""The encoder budget of a vision-language model: image tokens whose encoding may start in one
step. A chunk that would start an image past the budget ends before that image (the image waits
for a later step); the step's first image always goes, however large, so no image waits forever.
Counted conservatively: an image already in the encoder cache counts too."""

from __future__ import annotations

from rillet.core.sequence import Seq


def fit_images(seq: Seq, start: int, n: int, left: int, fresh: bool) -> tuple[int, int]:
    """(the chunk's tokens, cut before the first image over `left`; image tokens it starts).
    `fresh`: no image has started in this step yet."""
    if seq.mm is None:
        return n, 0
    used = 0
    for it in seq.mm.items:
        if not start <= it.offset < start + n:
            continue
        if used + it.length > left and not (fresh and used == 0):
            return it.offset - start, used
        used += it.length
    return n, used
