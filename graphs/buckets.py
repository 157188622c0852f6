"""Batch-size buckets: the batch sizes a decode graph is captured for.

A step with b sequences replays the graph of the smallest bucket >= b, padding the extra rows; a
step above the largest bucket runs eager. The default ladder is dense where small batches are
common and padding is proportionally expensive: 1, 2, 4, 8, then every 8 up to 64, then every 16,
always ending at max_num_seqs so every batch the scheduler can form has a graph.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def default_buckets(max_num_seqs: int) -> tuple[int, ...]:
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    ladder = [1, 2, 4, 8, *range(16, 65, 8)]
    ladder += range(80, max_num_seqs + 1, 16)
    return (*(b for b in ladder if b < max_num_seqs), max_num_seqs)


def resolve_buckets(configured: Sequence[int], max_num_seqs: int) -> tuple[int, ...]:
    """The buckets to capture: `configured` sorted (or the default ladder when empty).

    Configured buckets above max_num_seqs are dropped (no batch can reach them); a list left
    empty by that, a bucket < 1 or a repeated bucket is a ValueError naming `graphs.buckets`.
    """
    if not configured:
        return default_buckets(max_num_seqs)
    if any(b < 1 for b in configured) or len(set(configured)) != len(configured):
        raise ValueError(f"config key 'graphs.buckets': need distinct sizes >= 1, got {list(configured)}")
    kept = tuple(sorted(b for b in configured if b <= max_num_seqs))
    if not kept:
        raise ValueError(
            f"config key 'graphs.buckets': every bucket in {list(configured)} is above "
            f"scheduler.max_num_seqs={max_num_seqs}"
        )
    return kept


def select_bucket(batch: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= batch; None when batch is above the largest (run eager).

    `buckets` must be sorted ascending. A batch < 1 is a ValueError: an empty decode step is a
    caller bug, not something to pad.
    """
    if batch < 1:
        raise ValueError(f"decode batch must have >= 1 rows, got {batch}")
    i = bisect.bisect_left(buckets, batch)
    return buckets[i] if i < len(buckets) else None


def verify_buckets(buckets: tuple[int, ...], max_rows: int) -> tuple[int, ...]:
    """Decode buckets up to the first that holds `max_rows` rows (verify steps never have more:
    no sequence drafts while more than speculative.max_batch run)."""
    top = select_bucket(max(1, min(max_rows, buckets[-1])), buckets)
    assert top is not None
    return tuple(b for b in buckets if b <= top)
