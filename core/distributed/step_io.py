"""A step's model inputs as int64 tensors, for the broadcast from rank 0 to the other ranks.

header [8]: command, T (tokens), B (sequences), W (block-table width), num_prefills, 0, 0, 0
payload [3T + 2B + 1 + B*W]: input_ids, positions, slot_mapping (T each), query_start (B + 1),
seq_lens (B), block_tables (B * W, row-major). The host copies the attention backends read
(query lengths, sequence lengths) are rebuilt from query_start and seq_lens on the receiver.
Only what the forward reads travels, fully formed (rank 0's InputBuilder has already applied its
block-table updates and filled pending tokens from its future buffer): sampling stays on rank 0,
and the other ranks keep no per-sequence state.
"""

from __future__ import annotations

import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.runner.step_inputs import StepInputs

HEADER = 8
STEP, STOP = 1, 2


def header(cmd: int, inp: StepInputs | None = None) -> torch.Tensor:
    out = torch.zeros(HEADER, dtype=torch.int64)
    out[0] = cmd
    if inp is not None:
        m = inp.meta
        out[1], out[2] = inp.input_ids.shape[0], m.num_seqs
        out[3], out[4] = m.block_tables.shape[1], m.num_prefills
    return out


def payload_size(head: torch.Tensor) -> int:
    t, b, w = int(head[1]), int(head[2]), int(head[3])
    return 3 * t + 2 * b + 1 + b * w


def pack(inp: StepInputs) -> torch.Tensor:  # [payload_size] int64, on the inputs' device
    m = inp.meta
    return torch.cat(
        [
            inp.input_ids,
            inp.positions,
            m.slot_mapping,
            m.query_start.to(torch.int64),
            m.seq_lens.to(torch.int64),
            m.block_tables.to(torch.int64).reshape(-1),
        ]
    )


def unpack(head: torch.Tensor, payload: torch.Tensor, host: torch.Tensor, block_size: int) -> StepInputs:
    """`host`: query_start and seq_lens as a CPU tensor (the payload itself when it is on CPU)."""
    t, b, w, n_pre = (int(x) for x in head[1:5])
    ids, pos, slots, qstart, seq_lens, tables = torch.split(payload, [t, t, t, b + 1, b, b * w])
    qs_host = host[: b + 1].tolist() if host is not payload else qstart.tolist()
    sl_host = host[b + 1 : 2 * b + 1].tolist() if host is not payload else seq_lens.tolist()
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start=qstart.to(torch.int32),
        seq_lens=seq_lens.to(torch.int32),
        block_tables=tables.reshape(b, w).to(torch.int32),
        query_lens_cpu=[qs_host[i + 1] - qs_host[i] for i in range(b)],
        seq_lens_cpu=sl_host,
        block_size=block_size,
        num_prefills=n_pre,
    )
    empty = torch.empty(0, dtype=torch.int64, device=payload.device)
    return StepInputs(ids, pos, meta, empty, [], empty)
