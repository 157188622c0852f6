"""Bucket ladder, configured buckets, bucket selection; static buffers: padding and no reallocation."""

from __future__ import annotations

import pytest
import torch
from rillet.graphs.buckets import default_buckets, resolve_buckets, select_bucket
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.static_buffers import StaticBuffers


def test_default_ladder_is_dense_small_then_8_then_16_and_ends_at_max() -> None:
    assert default_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert default_buckets(128) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)
    assert default_buckets(100)[-4:] == (64, 80, 96, 100)  # max_num_seqs always included
    assert default_buckets(5) == (1, 2, 4, 5)
    assert default_buckets(8) == (1, 2, 4, 8)
    assert default_buckets(1) == (1,)
    with pytest.raises(ValueError):
        default_buckets(0)


def test_configured_buckets_sorted_and_capped() -> None:
    assert resolve_buckets((), 16) == default_buckets(16)
    assert resolve_buckets((8, 1, 4), 16) == (1, 4, 8)
    assert resolve_buckets((4, 32, 2), 16) == (2, 4)  # 32 can never be reached
    for bad in [(0, 4), (4, 4), (64,)]:
        with pytest.raises(ValueError, match=r"graphs\.buckets"):
            resolve_buckets(bad, 16)


@pytest.mark.parametrize(
    ("batch", "expected"),
    [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (63, 64), (64, 64), (65, None), (1000, None)],
)
def test_select_bucket(batch: int, expected: int | None) -> None:
    assert select_bucket(batch, default_buckets(64)) == expected


def test_select_bucket_rejects_empty_batch() -> None:
    with pytest.raises(ValueError, match=">= 1 rows"):
        select_bucket(0, (1, 2))


def _batch(ids: list[int], width: int, seed: int) -> DecodeBatch:
    g = torch.Generator().manual_seed(seed)
    n = len(ids)
    seq_lens = torch.randint(1, 16 * width, (n,), generator=g, dtype=torch.int32)
    return DecodeBatch(
        input_ids=torch.tensor(ids),
        positions=seq_lens.long() - 1,
        slot_mapping=torch.randint(16, 1000, (n,), generator=g),
        seq_lens=seq_lens,
        block_tables=torch.randint(1, 50, (n, width), generator=g, dtype=torch.int32),
        query_start=torch.arange(n + 1, dtype=torch.int32),
        seq_lens_cpu=seq_lens.tolist(),
    )


def test_fill_copies_rows_and_pads_the_rest() -> None:
    buf = StaticBuffers.allocate(8, 6, torch.device("cpu"))
    wide = _batch([5, 6, 7, 8, 9, 10, 11], width=6, seed=0)
    buf.fill(wide, 8)  # leaves stale values everywhere a later, smaller step must not see
    real = _batch([21, 22, 23], width=2, seed=1)
    view = buf.fill(real, 4)
    assert view.num_rows == 4
    assert view.input_ids.tolist() == [21, 22, 23, 0]
    assert view.positions.tolist() == [*real.positions.tolist(), 0]
    assert view.slot_mapping.tolist() == [*real.slot_mapping.tolist(), 0]
    assert view.seq_lens.tolist() == [*real.seq_lens.tolist(), 1]
    assert view.seq_lens_cpu == [*real.seq_lens_cpu, 1]
    assert view.query_start.tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(view.block_tables[:3, :2], real.block_tables)
    assert view.block_tables[:3, 2:].eq(0).all()  # the wide step's columns are gone
    assert view.block_tables[3].eq(0).all()


def test_fill_exact_bucket_has_no_padding() -> None:
    buf = StaticBuffers.allocate(4, 3, torch.device("cpu"))
    real = _batch([1, 2, 3, 4], width=3, seed=2)
    view = buf.fill(real, 4)
    assert torch.equal(view.input_ids, real.input_ids)
    assert torch.equal(view.block_tables, real.block_tables)
    assert view.seq_lens_cpu == real.seq_lens_cpu


def test_fill_never_reallocates() -> None:
    buf = StaticBuffers.allocate(16, 8, torch.device("cpu"))
    fields = ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables", "query_start")
    ptrs = {f: getattr(buf, f).data_ptr() for f in fields}
    for step, (b, bucket, width) in enumerate([(1, 1, 1), (16, 16, 8), (3, 4, 5), (9, 16, 2), (2, 2, 8)]):
        view = buf.fill(_batch(list(range(1, b + 1)), width, seed=step), bucket)
        for f in fields:
            assert getattr(buf, f).data_ptr() == ptrs[f], f
            assert getattr(view, f).data_ptr() == ptrs[f], f  # views share the static storage
    assert buf.padding(16).input_ids.data_ptr() == ptrs["input_ids"]


def test_padding_view_is_all_dummy() -> None:
    buf = StaticBuffers.allocate(4, 2, torch.device("cpu"))
    buf.fill(_batch([7, 8, 9, 10], width=2, seed=3), 4)
    view = buf.padding(4)
    assert view.input_ids.eq(0).all() and view.slot_mapping.eq(0).all() and view.block_tables.eq(0).all()
    assert view.seq_lens.eq(1).all() and view.seq_lens_cpu == [1, 1, 1, 1]


def test_fill_rejects_misfits() -> None:
    buf = StaticBuffers.allocate(4, 2, torch.device("cpu"))
    with pytest.raises(ValueError):
        buf.fill(_batch([1, 2, 3], width=2, seed=4), 2)  # bucket smaller than the batch
    with pytest.raises(ValueError):
        buf.fill(_batch([1, 2, 3, 4, 5], width=2, seed=4), 8)  # beyond the buffers
    with pytest.raises(ValueError, match="width"):
        buf.fill(_batch([1], width=3, seed=4), 1)
