"""The torch backend's bidirectional image blocks (AttentionMetadata.image_blocks, Gemma 3) against
the mask transformers builds from token_type_ids (masking_utils: causal OR same block, AND the
sliding window on sliding layers), for a fresh prefill and for the same prompt's later chunk over
a paged cache, with and without a window."""

from __future__ import annotations

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.torch_backend import TorchAttentionBackend

BS, HQ, HKV, D, S = 4, 4, 2, 8, 14
BLOCKS = ((3, 7), (9, 13))  # two images' tokens; 7, 8 and 13 are text
SCALE = D**-0.5


def hf_mask(window: int | None) -> torch.Tensor:
    """[S, S] from transformers' own mask functions, as Gemma 3 composes them."""
    from transformers.masking_utils import (
        and_masks,
        blockwise_overlay,
        causal_mask_function,
        or_masks,
        sliding_window_overlay,
    )

    ids = torch.full((1, S), -1)
    for i, (lo, hi) in enumerate(BLOCKS):
        ids[0, lo:hi] = i
    fn = or_masks(causal_mask_function, blockwise_overlay(ids))
    if window is not None:
        fn = and_masks(fn, sliding_window_overlay(window))
    b, h = torch.tensor(0), torch.tensor(0)
    return torch.tensor(
        [[bool(fn(b, h, torch.tensor(q), torch.tensor(k))) for k in range(S)] for q in range(S)]
    )


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    g = HQ // HKV
    qt, kt, vt = (x.transpose(0, 1) for x in (q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)))
    p = torch.softmax((qt @ kt.transpose(1, 2) * SCALE).masked_fill(~mask, float("-inf")), -1)
    return (p @ vt).transpose(0, 1)


@pytest.mark.parametrize("window", [None, 3, 5])
@pytest.mark.parametrize("cached", [0, 3, 9], ids=["fresh", "chunk-before-image", "chunk-at-image"])
def test_image_blocks_match_transformers_mask(window: int | None, cached: int) -> None:
    gen = torch.Generator().manual_seed(cached * 10 + (window or 0))
    q, k, v = (torch.randn(S, h, D, generator=gen) for h in (HQ, HKV, HKV))
    table = [5, 2, 7, 1]  # shuffled blocks; 0 is the dummy block
    slots = torch.tensor([table[p // BS] * BS + p % BS for p in range(S)])
    k_cache, v_cache = torch.zeros(8, BS, HKV, D), torch.zeros(8, BS, HKV, D)
    k_cache.view(-1, HKV, D)[slots[:cached]] = k[:cached]
    v_cache.view(-1, HKV, D)[slots[:cached]] = v[:cached]
    n = S - cached
    meta = AttentionMetadata(
        slot_mapping=slots[cached:],
        query_start=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([S], dtype=torch.int32),
        block_tables=torch.tensor([table], dtype=torch.int32),
        query_lens_cpu=[n],
        seq_lens_cpu=[S],
        block_size=BS,
        num_prefills=1,
        image_blocks=[tuple(b for b in BLOCKS if b[1] > cached)],
    )
    out = TorchAttentionBackend().forward(
        q[cached:], k[cached:], v[cached:], k_cache, v_cache, meta, SCALE, window=window
    )
    mask = hf_mask(window)
    assert mask[3, 6] and not mask[7, 9], "image tokens see their block ahead; text never looks ahead"
    torch.testing.assert_close(out, reference(q, k, v, mask)[cached:], atol=1e-5, rtol=1e-5)


def test_chunks_never_split_a_bidirectional_image() -> None:
    """MmPayload.chunk_tokens (the scheduler's and the block manager's cut) and blocks (the step's
    image_blocks), over images at [3, 7) and [9, 13)."""
    import numpy as np
    from rillet.core.vision.payload import MmItem, MmPayload

    items = tuple(MmItem(lo, hi - lo, bytes([lo]), np.zeros(1, np.float32)) for lo, hi in BLOCKS)
    mm = MmPayload(items, bidirectional=True)
    cases = {
        (0, 3): 3,
        (0, 5): 3,
        (0, 7): 7,
        (3, 2): 0,
        (3, 4): 4,
        (5, 3): 3,
        (5, 1): 0,
        (7, 4): 2,
        (0, 14): 14,
    }
    assert {k: mm.chunk_tokens(*k) for k in cases} == cases
    assert MmPayload(items).chunk_tokens(0, 5) == 5, "Qwen's images may be cut (embeddings sliced)"
    assert (mm.blocks(0, 8), mm.blocks(7, 9), mm.blocks(8, 14)) == (((3, 7),), (), ((9, 13),))
    assert MmPayload(items).blocks(0, 14) == ()
