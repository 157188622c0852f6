"""Batched token bitmasks for the constrained rows of a step: filled off the critical path, applied
to the logits just before sampling.

`MaskFiller.begin(seqs)` runs when the step's batch is known, before the model runs: it brings each
constrained row's matcher up to date with its output (see matcher.py) and starts filling one int32
bitmask row per constrained sequence ([R, ceil(V / 32)], bit j of word w allows token 32w + j) on a
worker thread. llguidance fills with the GIL released, so the fill overlaps the forward. The sampler
calls `PendingMask.apply(logits)`, which waits for the fill and masks those rows only; rows without
a grammar are never touched. Masks are applied to the logits after the model (outside any compiled
or captured graph), so they compose with compiled and graphed decode steps.

Lazy rows (`lazy=True`, `structured.lazy_masks`): a greedy row without logprobs gets no mask up
front. The sampler takes its argmax over the unmasked logits (after bias, penalties and the
min_tokens mask) and `PendingMask.fix_lazy` asks the matcher whether that token is allowed
(`validate_tokens`, a few microseconds); only when it is not is the row's mask filled and the
argmax taken again over the allowed tokens of the same logits. The token is the same as with a
full mask: the masked argmax equals the unmasked one whenever the unmasked one is allowed (ties
included: argmax takes the first maximum either way), and a -inf commutes with the bias and
penalties (constrained requests get a repetition penalty by default: structured/defaults.py).
llama.cpp's sampler checks its grammar the same way. It saves the fill's CPU time, which
on a CPU model is taken from the forward's threads; the price is a device->host read of the
tokens, so `auto` keeps it off on CUDA.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from rillet.core.sequence import Seq
from rillet.core.structured.matcher import GrammarMatcher

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
    lazy_rows: int = 0  # rows sampled unmasked first (lazy masks)
    lazy_misses: int = 0  # ... whose token the grammar refused: masked and sampled again
    check_s: float = 0.0  # validating lazy rows' tokens, and filling the misses' masks


class PendingMask:
    """The bitmask of one step's constrained rows, possibly still being filled."""

    def __init__(
        self,
        rows: list[int],
        bits: torch.Tensor,
        fill: Future[None] | None,
        stats: MaskStats,
        lazy: list[tuple[int, Any]] | None = None,
        filler: MaskFiller | None = None,
    ) -> None:
        self.rows = rows  # row of the step's logits for each bitmask row
        self.bits = bits  # [R, W] int32
        self.lazy = lazy or []  # (row of the step's logits, llguidance matcher): checked after sampling
        self._fill = fill
        self._stats = stats
        self._filler = filler

    def fix_lazy(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [S] (argmax of `logits` on the lazy rows) -> the same with every refused lazy
        row's token replaced by its argmax over the tokens its grammar allows."""
        if not self.lazy:
            return tokens
        assert self._filler is not None
        t0 = time.perf_counter()
        chosen = tokens.tolist()
        vocab = self._filler.vocab_size
        misses = [(i, m) for i, m in self.lazy if chosen[i] >= vocab or m.validate_tokens([chosen[i]]) != 1]
        self._stats.lazy_rows += len(self.lazy)
        if misses:
            self._stats.lazy_misses += len(misses)
            bits = torch.empty(len(misses), self._filler.words, dtype=torch.int32)
            self._filler.fill_now([(m, j) for j, (_, m) in enumerate(misses)], bits)
            index = torch.tensor([i for i, _ in misses], dtype=torch.long, device=logits.device)
            allowed = _fit(_unpack(bits, logits.device), logits.shape[1])
            masked = torch.where(allowed, logits.index_select(0, index), float("-inf"))
            tokens = tokens.clone()
            tokens[index] = masked.argmax(dim=-1).to(tokens.dtype)
        self._stats.check_s += time.perf_counter() - t0
        return tokens

    def take(self, rows: list[int]) -> PendingMask | None:
        """The mask of the step's rows `rows` (ascending) alone, for sampling them as a batch of
        their own (a verify step's rounds, core/runner/verify_rounds.py). Masks filled inline only."""
        assert self._fill is None and not self.lazy, "take() needs a mask filled inline"
        where = {row: i for i, row in enumerate(rows)}
        keep = [j for j, row in enumerate(self.rows) if row in where]
        if not keep:
            return None
        return PendingMask([where[self.rows[j]] for j in keep], self.bits[keep], None, self._stats)

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
        device = logits.device
        if not self.rows:  # lazy rows only
            return logits
        allowed = _fit(_unpack(self.bits, device), logits.shape[1])  # [R, V] bool
        if len(self.rows) == logits.shape[0]:  # every row constrained (rows are 0..S-1 in order)
            return torch.where(allowed, logits, float("-inf"))
        index = torch.tensor(self.rows, dtype=torch.long, device=device)
        out = logits.clone()
        out[index] = torch.where(allowed, logits.index_select(0, index), float("-inf"))
        return out


def _fit(allowed: torch.Tensor, width: int) -> torch.Tensor:
    """[R, 32W] bool -> [R, width]: logits wider than the grammar's vocabulary never allow the
    extra ids."""
    if allowed.shape[1] >= width:
        return allowed[:, :width]
    pad = torch.zeros(allowed.shape[0], width - allowed.shape[1], dtype=torch.bool, device=allowed.device)
    return torch.cat([allowed, pad], dim=1)


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

    def __init__(self, vocab_size: int, eos_token_ids: tuple[int, ...], lazy: bool = False) -> None:
        import llguidance

        self.lazy = lazy  # greedy rows without logprobs: mask only when their argmax is refused
        self.vocab_size = vocab_size  # = the grammar tokenizer's n_vocab
        self.words = (vocab_size + 31) // 32
        self.eos_token_ids = eos_token_ids
        self._executor = llguidance.LLExecutor()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rillet-grammar")
        self.stats = MaskStats()

    def begin(self, seqs: list[Seq]) -> PendingMask | None:
        """Start the bitmask of the constrained rows among `seqs` (the rows that sample this step)."""
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if not rows:
            return None
        lazy: list[tuple[int, Any]] = []  # (row, matcher): checked after sampling
        filled: list[tuple[int, GrammarMatcher]] = []  # masked up front
        for i in rows:
            g = seqs[i].grammar
            assert g is not None
            try:
                g.sync(seqs[i].output_ids)
            except Exception:  # the engine fails the request on its own accept; here: EOS only
                log.debug("grammar of sequence %d is broken", seqs[i].seq_id, exc_info=True)
            if self.lazy and not g.failed and seqs[i].params.greedy_without_logprobs():
                lazy.append((i, g.matcher))
            else:
                filled.append((i, g))
        self.stats.steps += 1
        self.stats.rows += len(filled)
        bits = torch.empty(len(filled), self.words, dtype=torch.int32)
        work: list[tuple[Any, int]] = []
        for j, (_, g) in enumerate(filled):
            if g.failed:
                self.eos_only(bits[j])
            else:
                work.append((g.matcher, j))
        fill = None
        if len(work) < _INLINE_ROWS:
            self._fill(work, bits)
        else:
            fill = self._pool.submit(self._fill, work, bits)
        return PendingMask([i for i, _ in filled], bits, fill, self.stats, lazy, self)

    def fill_now(self, work: list[tuple[Any, int]], bits: torch.Tensor) -> None:
        """Fill `bits` rows for (matcher, row) pairs on this thread (a lazy row's miss)."""
        self._executor.unsafe_compute_mask_ptr(work, bits.data_ptr(), self.words * 4, bits.shape[0])

    def _fill(self, work: list[tuple[Any, int]], bits: torch.Tensor) -> None:
        if work:
            t0 = time.perf_counter()
            self.fill_now(work, bits)
            self.stats.fill_s += time.perf_counter() - t0

    def eos_only(self, row: torch.Tensor) -> None:
        """A bitmask row that allows EOS only (a broken or finished grammar)."""
        row.zero_()
        for t in self.eos_token_ids:
            if 0 <= t < self.vocab_size:
                row[t // 32] |= 1 << (t % 32) if t % 32 < 31 else -(2**31)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
