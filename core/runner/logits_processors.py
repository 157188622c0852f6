"""The logits transforms the sampler applies to a batch: penalties, top-k / top-p, min-p.

Each works on a [rows, vocab] tensor with per-row knobs already on the device, and reads nothing
of a row but its knobs and, for penalties, its token history (gathered here as flat (row, token)
pairs). Apart from sampler.py, which decides which rows get which transform, in what order, and
draws: these are the tensor maths alone, tested directly against dense reference formulas.
`to_device` (a host list onto the device without a sync) serves both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from rillet.core.sequence import Seq

_CPU_PREFIX = 1024  # on CPU, top-p first tries the best 1024 tokens instead of sorting all


def to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host list -> device tensor without a stream sync (a pageable copy is staged at once)."""
    return torch.tensor(data, dtype=dtype).to(device, non_blocking=True)


@dataclass(slots=True)
class TokenHistory:
    """Distinct (row, token) pairs of the penalised rows, flattened: O(history), not O(rows * vocab)."""

    seen_rows: torch.Tensor  # [S] long: pairs over prompt + output
    seen_ids: torch.Tensor  # [S] long
    out_rows: torch.Tensor  # [O] long: pairs over the output
    out_ids: torch.Tensor  # [O] long
    out_counts: torch.Tensor  # [O] float32: occurrences in the output

    @classmethod
    def of(cls, seqs: list[Seq], rows: list[int], device: torch.device) -> TokenHistory:
        """History of seqs[j], placed at logits row rows[j]."""
        seen_rows: list[int] = []
        seen_ids: list[int] = []
        out_rows: list[int] = []
        out_ids: list[int] = []
        out_counts: list[int] = []
        for row, seq in zip(rows, seqs, strict=True):
            seen = set(seq.prompt_ids).union(seq.output_ids)
            seen_rows += [row] * len(seen)
            seen_ids += seen
            counts = Counter(seq.output_ids)
            out_rows += [row] * len(counts)
            out_ids += counts.keys()
            out_counts += counts.values()
        return cls(
            to_device(seen_rows, torch.long, device),
            to_device(seen_ids, torch.long, device),
            to_device(out_rows, torch.long, device),
            to_device(out_ids, torch.long, device),
            to_device(out_counts, torch.float32, device),
        )


def apply_penalties(
    logits: torch.Tensor,  # [B, V] float32, changed in place
    history: TokenHistory,
    repetition: torch.Tensor,  # [B]
    presence: torch.Tensor,  # [B]
    frequency: torch.Tensor,  # [B]
) -> None:
    """HF/CTRL repetition penalty over prompt + output (positive logits divided, negative multiplied),
    then OpenAI presence/frequency over the output: logit -= presence * (count > 0) + frequency * count.
    Every (row, token) pair is distinct, so the indexed writes never collide."""
    rows, ids = history.seen_rows, history.seen_ids
    values, rep = logits[rows, ids], repetition[rows]  # [S]
    logits[rows, ids] = torch.where(values > 0, values / rep, values * rep)
    rows, ids = history.out_rows, history.out_ids
    logits[rows, ids] -= presence[rows] + frequency[rows] * history.out_counts


def apply_top_k_top_p(
    logits: torch.Tensor,  # [R, V]
    top_k: torch.Tensor,  # [R] long; V = off
    top_p: torch.Tensor,  # [R] float; > 1 = off
    k_max: int | None = None,  # max(top_k), known on the host; None = V
) -> torch.Tensor:
    """Keeps the k best tokens, then the smallest best-first prefix whose renormalised mass >= top_p.

    Top-p only ever looks inside the top-k set, so a partial sort of the best k_max tokens suffices.
    """
    vocab = logits.shape[-1]
    k = vocab if k_max is None else min(k_max, vocab)
    if k > _CPU_PREFIX and logits.device.type == "cpu":
        # A CPU sort of a whole vocabulary costs ~10 ms a row, and the nucleus usually ends far sooner;
        # checking that on the host is free here, as there is no device to wait for.
        kept, cum = _keep_best_prefix(logits, top_k, top_p, _CPU_PREFIX)
        top_p_only = (top_k >= vocab) & (cum[:, -1] >= top_p)
        settled = (top_k <= _CPU_PREFIX) | top_p_only
        if bool(settled.all()):
            return kept
        # only the rows the prefix did not settle, so that a row's result never depends on its
        # neighbours (the whole-vocabulary path rounds its normalisation differently)
        redo = (~settled).nonzero().flatten()
        kept[redo] = _keep_best_prefix(logits[redo], top_k[redo], top_p[redo], k)[0]
        return kept
    return _keep_best_prefix(logits, top_k, top_p, k)[0]


def _keep_best_prefix(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k / top-p among the k best tokens only; also returns the cumulative mass [R, k]. Exact for a
    row when top_k <= k, or when top-k is off and its k best tokens already hold top_p of the mass."""
    vocab = logits.shape[-1]
    if k == vocab:
        best, order = logits.sort(dim=-1, descending=True)  # [R, K]
    else:
        best, order = logits.topk(k, dim=-1)  # [R, K], best first
    positions = torch.arange(k, device=logits.device)
    best.masked_fill_(positions >= top_k[:, None], float("-inf"))
    # normalise over the row's top-k set: all among the k best when top_k <= k, else the whole vocabulary
    inside = (top_k <= k)[:, None]
    log_norm = torch.where(inside, best.logsumexp(-1, keepdim=True), logits.logsumexp(-1, keepdim=True))
    cum = (best - log_norm).exp().cumsum(dim=-1)  # [R, K]
    # mass strictly before each position: position j survives while the best j tokens hold < top_p
    before = torch.nn.functional.pad(cum[:, :-1], (1, 0))
    drop = before >= top_p[:, None]
    drop[:, 0] = False
    best.masked_fill_(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(-1, order, best), cum


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drops tokens with p < min_p * p_max, i.e. logit < max_logit + log(min_p) (min_p = 0 drops none)."""
    threshold = logits.amax(dim=-1, keepdim=True) + min_p[:, None].log()  # [R, 1]
    return logits.masked_fill(logits < threshold, float("-inf"))
