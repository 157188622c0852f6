"""Batched token bitmasks for the constrained rows of a step: filled off the critical path, applied
to the logits just before sampling.

`MaskFiller.begin(seqs)` runs when the step's batch is known, before the model runs: it brings each
constrained row's matcher up to date with its output (see matcher.py) and starts filling one int32
bitmask row per constrained sequence ([R, ceil(V / 32)], bit j of word w allows token 32w + j) on a
worker thread. llguidance fills with the GIL released, so the fill overlaps the forward. The sampler
calls `PendingMask.apply(logits)`, which waits for the fill and masks those rows only; rows without
a grammar are never touched. Masks are applied to the logits after the model (outside any compiled
or captured graph), so they compose with compiled and graphed decode steps.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..request import Sequence

log = logging.getLogger(__name__)

# Below this many constrained rows the fill (~30 us a row) is cheaper inline than a thread hand-off.
_INLINE_ROWS = 4


@dataclass
class MaskStats:
    """Seconds spent on masks, summed over steps (the benchmark reads them)."""

    steps: int = 0
    rows: int = 0
    fill_s: float = 0.0  # filling bitmasks (on the worker thread when overlapped)
    wait_s: float = 0.0  # the sampler waiting for a fill still running after the forward
    apply_s: float = 0.0  # unpacking the bits and masking the logits


class PendingMask:
    """The bitmask of one step's constrained rows, possibly still being filled."""

    def __init__(
        self, rows: list[int], bits: torch.Tensor, fill: Future[None] | None, stats: MaskStats
    ) -> None:
        self.rows = rows  # row of the step's logits for each bitmask row
        self.bits = bits  # [R, W] int32
        self._fill = fill
        self._stats = stats

    def wait(self) -> None:
        if self._fill is not None:
            t0 = time.perf_counter()
            self._fill.result()
            self._fill = None
            self._stats.wait_s += time.perf_counter() - t0

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [S, V] -> a copy with every disallowed token of the constrained rows at -inf."""
        self.wait()
        t0 = time.perf_counter()
        out = self._masked(logits)
        self._stats.apply_s += time.perf_counter() - t0
        return out

    def _masked(self, logits: torch.Tensor) -> torch.Tensor:
        device, width = logits.device, logits.shape[1]
        allowed = _unpack(self.bits, device)  # [R, 32W] bool
        if allowed.shape[1] >= width:
            allowed = allowed[:, :width]
        else:  # logits wider than the grammar's vocabulary: the extra ids are never allowed
            pad = torch.zeros(len(self.rows), width - allowed.shape[1], dtype=torch.bool, device=device)
            allowed = torch.cat([allowed, pad], dim=1)
        if len(self.rows) == logits.shape[0]:  # every row constrained (rows are 0..S-1 in order)
            return torch.where(allowed, logits, float("-inf"))
        index = torch.tensor(self.rows, dtype=torch.long, device=device)
        out = logits.clone()
        out[index] = torch.where(allowed, logits.index_select(0, index), float("-inf"))
        return out


def _unpack(bits: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[R, W] int32 bitmask -> [R, 32W] bool (token 32w + j allowed iff bit j of word w is set)."""
    if device.type == "cpu":  # numpy's unpackbits is ~20x faster than shifts in torch on CPU
        raw = np.unpackbits(bits.numpy().view(np.uint8), axis=1, bitorder="little")
        return torch.from_numpy(raw).view(torch.bool)
    words = bits.to(device, non_blocking=True)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    return ((words[:, :, None] >> shifts) & 1).bool().flatten(1)


class MaskFiller:
    """Starts each step's mask fill; one worker thread, so fills never overlap each other."""

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        import llguidance

        self.vocab_size = vocab_size  # = the grammar tokenizer's n_vocab
        self.words = (vocab_size + 31) // 32
        self.eos_token_ids = eos_token_ids
        self._executor = llguidance.LLExecutor()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rillet-grammar")
        self.stats = MaskStats()

    def begin(self, seqs: list[Sequence]) -> PendingMask | None:
        """Start the bitmask of the constrained rows among `seqs` (the rows that sample this step)."""
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if not rows:
            return None
        self.stats.steps += 1
        self.stats.rows += len(rows)
        bits = torch.empty(len(rows), self.words, dtype=torch.int32)
        work: list[tuple[Any, int]] = []
        for j, i in enumerate(rows):
            g = seqs[i].grammar
            assert g is not None
            try:
                g.sync(seqs[i].output_ids)
            except Exception:  # the engine fails the request on its own accept; here: EOS only
                log.debug("grammar of sequence %d is broken", seqs[i].seq_id, exc_info=True)
            if g.failed:
                self._eos_only(bits[j])
            else:
                work.append((g.matcher, j))
        if len(work) < _INLINE_ROWS:
            self._fill(work, bits)
            return PendingMask(rows, bits, None, self.stats)
        return PendingMask(rows, bits, self._pool.submit(self._fill, work, bits), self.stats)

    def _fill(self, work: list[tuple[Any, int]], bits: torch.Tensor) -> None:
        if work:
            t0 = time.perf_counter()
            self._executor.unsafe_compute_mask_ptr(work, bits.data_ptr(), self.words * 4, bits.shape[0])
            self.stats.fill_s += time.perf_counter() - t0

    def _eos_only(self, row: torch.Tensor) -> None:
        row.zero_()
        for t in self.eos_token_ids:
            if 0 <= t < self.vocab_size:
                row[t // 32] |= 1 << (t % 32) if t % 32 < 31 else -(2**31)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
