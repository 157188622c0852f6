"""flashinfer's paged-KV layout, computed on the host from a step's lengths and block tables.

plan() takes CSR-style arrays (kv_indptr, the concatenated page indices, last_page_len); the
backend (flashinfer_backend.py) builds them here every step from the metadata's host copies of the
lengths, so nothing waits on the device: only the gather of page indices runs there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def paged_kv_host(
    seq_lens_cpu: Sequence[int], block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host (CPU int32) page layout: kv_indptr [B+1], last_page_len [B], pages per sequence [B].

    A context of 0 tokens is treated as 1 (the dummy slot its block table points at), so every
    row owns >= 1 page and 1 <= last_page_len <= block_size, as flashinfer requires.
    """
    seq = torch.tensor(seq_lens_cpu, dtype=torch.int32).clamp(min=1)
    pages = (seq + block_size - 1) // block_size
    indptr = torch.zeros(len(seq_lens_cpu) + 1, dtype=torch.int32)
    torch.cumsum(pages, 0, out=indptr[1:])
    return indptr, seq - (pages - 1) * block_size, pages


def qo_indptr_host(query_lens_cpu: Sequence[int]) -> torch.Tensor:  # [B+1] int32 CPU
    indptr = torch.zeros(len(query_lens_cpu) + 1, dtype=torch.int32)
    torch.cumsum(torch.tensor(query_lens_cpu, dtype=torch.int32), 0, out=indptr[1:])
    return indptr


def page_indices(
    block_tables: torch.Tensor,  # [B, W] int32 on the device
    kv_indptr: torch.Tensor,  # [B+1] int32 CPU
    pages: torch.Tensor,  # [B] int32 CPU
) -> torch.Tensor:  # [kv_indptr[-1]] int32 on the device: each sequence's used blocks, concatenated
    """Gathers on the device with host-computed positions: no device->host sync."""
    n, width = block_tables.shape
    total = int(kv_indptr[-1])
    reps = pages.long()
    rows = torch.repeat_interleave(torch.arange(n), reps, output_size=total)
    cols = torch.arange(total) - torch.repeat_interleave(kv_indptr[:-1].long(), reps, output_size=total)
    flat = (rows * width + cols).to(block_tables.device, non_blocking=True)
    return block_tables.reshape(-1).index_select(0, flat)
