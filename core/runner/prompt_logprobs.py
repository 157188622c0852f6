"""Prompt logprobs (params.prompt_logprobs): each prompt token's logprob under the model's raw
logits at the position before it, and the top N there, from a prefill chunk's hidden states.

Computed in slices of rows: a slice's logits are [rows, V] float32 (V = 49,152 for the default
model: 12 MiB per 64 rows), so a long prompt never holds its whole [T, V] at once. Raw logits:
no temperature, penalty, bias or grammar applies to a prompt token (as vLLM reports them).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from rillet.core.runner.step_inputs import PromptRows
from rillet.core.sequence import Seq, TokenLogprob

SLICE_ROWS = 64
Logits = Callable[[torch.Tensor], torch.Tensor]  # [R, H] -> [R, V]


def prompt_logprobs(
    logits_of: Logits, hidden: torch.Tensor, chunks: list[PromptRows]
) -> list[tuple[Seq, int, list[TokenLogprob]]]:
    """(sequence, position of its first scored row, one TokenLogprob per target) per chunk;
    `hidden` [T, H] in the step's flat token layout."""
    out = []
    for c in chunks:
        top_n = c.seq.params.prompt_logprobs or 0
        lps: list[TokenLogprob] = []
        for a in range(0, len(c.targets), SLICE_ROWS):
            targets = c.targets[a : a + SLICE_ROWS]
            rows = hidden[c.first + a : c.first + a + len(targets)]  # [R, H]
            lps += _score(logits_of(rows), targets, top_n)
        out.append((c.seq, c.start, lps))
    return out


def _score(logits: torch.Tensor, targets: list[int], top_n: int) -> list[TokenLogprob]:
    lp = torch.log_softmax(logits.float(), dim=-1)  # [R, V]
    ids = torch.tensor(targets, device=lp.device)
    chosen = lp.gather(1, ids[:, None])[:, 0].tolist()  # [R]
    if top_n == 0:
        return [TokenLogprob(t, c, []) for t, c in zip(targets, chosen, strict=True)]
    vals, top_ids = lp.topk(top_n, dim=-1)  # [R, N], best first
    return [
        TokenLogprob(t, c, list(zip(i, v, strict=True)))
        for t, c, i, v in zip(targets, chosen, top_ids.tolist(), vals.tolist(), strict=True)
    ]
