"""Batched next-token sampling: logit bias, penalties, min_tokens, temperature, top-k / top-p / min-p,
seeded draws.

Order per row: grammar mask (constrained rows) -> logit bias -> penalties -> min_tokens mask ->
[logprobs taken here] -> temperature -> top-k -> top-p (over the top-k renormalised distribution) ->
min-p -> draw. Greedy rows take the argmax after the min_tokens mask. A masked token is -inf, and
-inf plus any bias stays -inf: the bias added after the mask is the bias added before it. The
tensor maths of penalties, top-k / top-p and min-p is in logits_processors.py.

Logprobs are `log_softmax` of the logits after bias, penalties and the min_tokens mask, before
temperature and truncation. vLLM returns the raw model's logprobs by default; we take them after
penalties so that a greedy row's sampled token is always the top-1 entry, and before
temperature/truncation so that they stay finite and comparable across requests that differ only in
their sampling knobs.

Draws use the exponential race: `argmax(p / q)` with `q = -log(u) ~ Exponential(1)` i.i.d. per vocab entry
picks token i with probability p_i. A seeded row fills its `q` row from a generator of its own, seeded
by (its seed, the output position it samples), so its output depends only on its seed and its logits,
not on its batch neighbours, its row position, or how many positions a step samples (speculative
decoding samples several per step: core/spec/views.py). Unseeded rows share the sampler's generator.
"""

from __future__ import annotations

from itertools import chain

import torch
from rillet.core.runner.base import SampleResult
from rillet.core.runner.inflight.sample_output import DeviceSample, pack_logprobs
from rillet.core.runner.logits_processors import (
    TokenHistory,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    to_device,
)
from rillet.core.sampling_params import GREEDY_EPS
from rillet.core.sequence import Seq
from rillet.core.structured.masks import PendingMask

__all__ = ["DeviceSample", "SampleResult", "Sampler"]

_TOP_P_OFF = 2.0  # above any cumulative sum, so rounding past 1.0 never drops tail tokens


class Sampler:
    def __init__(
        self, vocab_size: int, eos_token_ids: tuple[int, ...], device: torch.device, seed: int | None = None
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(t for t in eos_token_ids if 0 <= t < vocab_size)
        self.device = device
        self._generator = torch.Generator(device=device)
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._seeded: dict[int, torch.Generator] = {}  # seq_id -> its own generator

    def release(self, seq_id: int) -> None:
        self._seeded.pop(seq_id, None)

    def sample(self, logits: torch.Tensor, seqs: list[Seq], mask: PendingMask | None = None) -> SampleResult:
        """logits [B, V] float32, rows in the order of `seqs`. Does not modify `logits`.

        `mask`: the grammar bitmasks of the constrained rows, applied first (like the min_tokens
        mask, before logprobs are taken, so a greedy row's token is its top-1 logprob)."""
        return self.sample_device(logits, seqs, mask).start_copy().wait()

    def sample_device(
        self, logits: torch.Tensor, seqs: list[Seq], mask: PendingMask | None = None
    ) -> DeviceSample:
        """As `sample`, but the result stays on the device (inflight/sample_output.py): nothing waits for it.

        Reads only host state that is complete while a step is in flight (params, the count of
        outputs with the pending one); penalised and grammar-constrained rows also read the output
        ids, so the engine lands the step in flight before it schedules them (core/engine/overlap.py)."""
        if mask is not None:
            logits = mask.apply(logits)  # a masked copy (of the rows filled up front)
        if all(self._plain_greedy(s) for s in seqs):
            tokens = logits.argmax(dim=-1)
            return DeviceSample(tokens if mask is None else mask.fix_lazy(logits, tokens))
        logits = logits.to(torch.float32, copy=True)
        self._bias(logits, seqs)
        self._penalise(logits, seqs)
        self._mask_min_tokens(logits, seqs)
        lp_rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        logprobs = None
        if lp_rows:
            index = self._index(lp_rows)
            logprobs = logits[index].log_softmax(dim=-1)  # [L, V]
        tokens = self._choose(logits, seqs)  # [B] long
        if mask is not None:  # lazy rows are greedy: their token is the argmax of these logits
            tokens = mask.fix_lazy(logits, tokens)
        if logprobs is None:
            return DeviceSample(tokens)
        return pack_logprobs(tokens, logprobs, lp_rows, seqs, index)

    def argmax_only(self, seqs: list[Seq]) -> bool:
        """Every row's token is the argmax of its raw logits and nothing else is read from them (no
        grammar mask either): the rows may take DecoderModel.greedy_tokens, no logits."""
        return all(s.params.grammar is None and self._plain_greedy(s) for s in seqs)

    def _plain_greedy(self, seq: Seq) -> bool:
        return seq.params.plain_greedy(seq.num_generated, self.eos_token_ids)

    def _min_tokens_active(self, seq: Seq) -> bool:
        return seq.params.min_tokens_active(seq.num_generated, self.eos_token_ids)

    def _index(self, rows: list[int]) -> torch.Tensor:
        return to_device(rows, torch.long, self.device)

    def _bias(self, logits: torch.Tensor, seqs: list[Seq]) -> None:
        """logit_bias: each row's (token, bias) pairs added in place (ids are distinct within a row)."""
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        for i, s in enumerate(seqs):
            for token_id, bias in s.params.logit_bias:
                rows.append(i)
                cols.append(token_id)
                values.append(bias)
        if rows:
            added = to_device(values, torch.float32, self.device)
            logits.index_put_((self._index(rows), self._index(cols)), added, accumulate=True)

    def _penalise(self, logits: torch.Tensor, seqs: list[Seq]) -> None:
        rows = [i for i, s in enumerate(seqs) if s.params.has_penalties]
        if not rows:
            return
        knobs = to_device(
            [
                [s.params.repetition_penalty, s.params.presence_penalty, s.params.frequency_penalty]
                for s in seqs
            ],
            torch.float32,
            self.device,
        )  # [B, 3]; neutral on rows without penalties, which have no history pairs anyway
        history = TokenHistory.of([seqs[i] for i in rows], rows, self.device)
        apply_penalties(logits, history, knobs[:, 0], knobs[:, 1], knobs[:, 2])

    def _mask_min_tokens(self, logits: torch.Tensor, seqs: list[Seq]) -> None:
        """Before min_tokens outputs, EOS and stop_token_ids cannot be drawn (ignore_eos or not)."""
        rows: list[int] = []
        cols: list[int] = []
        for i, s in enumerate(seqs):
            if not self._min_tokens_active(s):
                continue
            banned = {t for t in chain(self.eos_token_ids, s.params.stop_token_ids) if t < self.vocab_size}
            rows.extend([i] * len(banned))
            cols.extend(banned)
        if rows:
            logits[self._index(rows), self._index(cols)] = float("-inf")

    def _choose(self, logits: torch.Tensor, seqs: list[Seq]) -> torch.Tensor:
        random_rows = [i for i, s in enumerate(seqs) if s.params.temperature >= GREEDY_EPS]
        if not random_rows:
            return logits.argmax(dim=-1)
        if len(random_rows) == len(seqs):
            return self._draw(logits, seqs)
        tokens = logits.argmax(dim=-1)
        index = self._index(random_rows)
        tokens[index] = self._draw(logits[index], [seqs[i] for i in random_rows])
        return tokens

    def _draw(self, logits: torch.Tensor, seqs: list[Seq]) -> torch.Tensor:
        """logits [R, V] of non-greedy rows -> sampled ids [R]."""
        vocab = self.vocab_size
        rows = [
            [p.temperature, min(p.top_k or vocab, vocab), p.top_p, p.min_p] for p in (s.params for s in seqs)
        ]
        knobs = to_device(rows, torch.float32, self.device)  # [R, 4]; top_k exact in float32 below 2**24
        logits = logits / knobs[:, 0:1]
        truncated = [i for i, s in enumerate(seqs) if s.params.top_k or s.params.top_p < 1.0]
        if truncated:
            logits = self._truncate(logits, knobs, truncated, [int(r[1]) for r in rows])
        if any(s.params.min_p > 0.0 for s in seqs):
            logits = apply_min_p(logits, knobs[:, 3])
        probs = logits.softmax(dim=-1)
        return probs.div_(self._exponentials(probs, seqs)).argmax(dim=-1)

    def _truncate(
        self, logits: torch.Tensor, knobs: torch.Tensor, rows: list[int], top_ks: list[int]
    ) -> torch.Tensor:
        """Top-k / top-p on the rows that ask for it only: the others would need a full sort for
        nothing. Rows go in groups of one top_k (`top_ks`, host values), each with its own k: a
        row's result then depends on its own knobs only, whatever its batch (deterministic mode)."""
        groups: dict[int, list[int]] = {}
        for i in rows:
            groups.setdefault(top_ks[i], []).append(i)
        for k, group in groups.items():
            index = None if len(group) == len(logits) else self._index(group)
            sub_logits, sub_knobs = (logits, knobs) if index is None else (logits[index], knobs[index])
            top_p = torch.where(sub_knobs[:, 2] < 1.0, sub_knobs[:, 2], _TOP_P_OFF)
            kept = apply_top_k_top_p(sub_logits, sub_knobs[:, 1].long(), top_p, k)
            if index is None:
                return kept
            logits[index] = kept
        return logits

    def _exponentials(self, probs: torch.Tensor, seqs: list[Seq]) -> torch.Tensor:
        """-log(u), u ~ U[0, 1) (twice as fast as exponential_() on CPU). u = 0 gives q = inf, which only
        drops that token from this one race; the clamp guards q = 0, which would turn a masked token's
        0 / q into NaN, and argmax prefers NaN to any number."""
        race = torch.empty_like(probs).uniform_(generator=self._generator)
        for i, s in enumerate(seqs):
            if s.params.seed is not None:
                race[i].uniform_(generator=self._generator_for(s))
        return race.log_().neg_().clamp_(min=torch.finfo(race.dtype).tiny)

    def _generator_for(self, seq: Seq) -> torch.Generator:
        """seq's generator, seeded for the output position it samples now (num_generated)."""
        gen = self._seeded.get(seq.seq_id)
        if gen is None:
            gen = self._seeded[seq.seq_id] = torch.Generator(device=self.device)
        assert seq.params.seed is not None
        gen.manual_seed(position_seed(seq.params.seed, seq.num_generated))
        return gen


def position_seed(seed: int, position: int) -> int:
    """A 64-bit generator seed for (request seed, output position): a multiplicative hash, so
    neighbouring positions and neighbouring seeds (n > 1 choices use seed + i) get unrelated
    streams."""
    return ((seed % 2**64) * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) % 2**64
