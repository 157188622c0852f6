"""A verify-only step's flat token layout -> the padded [rows, Q] layout of the graph-safe verify
step (attention/paged_verify.py, graphs' VerifyBatch), and back.

The flat layout (step_inputs.py) packs each row's 1 + k_r tokens back to back. The padded one gives
every row Q = 1 + speculative.num_tokens query slots: row r's tokens fill slots [r * Q, r * Q + 1 +
k_r), the rest are padding (token 0 at position 0 into slot 0, the dummy block). In a verify-only
step every token is sampled, in flat order, so the step's hidden states are the padded output's
rows at the real slots.
"""

from __future__ import annotations

import torch
from rillet.core.runner.step_inputs import StepInputs
from rillet.graphs.interface import VerifyBatch


def padded_verify_batch(inp: StepInputs, num_queries: int) -> tuple[VerifyBatch, torch.Tensor] | None:
    """(the padded batch, [T] long: the padded row of each flat token), or None when a row has
    more than `num_queries` tokens."""
    m = inp.meta
    qlens = m.query_lens_cpu
    if max(qlens) > num_queries:
        return None
    t = inp.input_ids.shape[0]
    gather: list[int] = []  # per padded slot: its flat token, or t (a padding value)
    real: list[int] = []  # per flat token: its padded slot
    start = 0
    for r, n in enumerate(qlens):
        gather += range(start, start + n)
        gather += [t] * (num_queries - n)
        real += range(r * num_queries, r * num_queries + n)
        start += n
    device = inp.input_ids.device
    index = torch.tensor(gather + real, dtype=torch.long).to(device, non_blocking=True)
    at, rows = index[: len(gather)], index[len(gather) :]
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    b = len(qlens)

    def padded(x: torch.Tensor) -> torch.Tensor:  # [T] -> [B, Q], padding slots 0
        return torch.cat([x, zero]).index_select(0, at).view(b, num_queries)

    batch = VerifyBatch(
        input_ids=padded(inp.input_ids),
        positions=padded(inp.positions),
        slot_mapping=padded(m.slot_mapping),
        seq_lens=m.seq_lens,
        query_lens=(m.query_start[1:] - m.query_start[:-1]).to(torch.int32),
        block_tables=m.block_tables,
        seq_lens_cpu=m.seq_lens_cpu,
        query_lens_cpu=qlens,
    )
    return batch, rows
