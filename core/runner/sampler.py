"""Batched next-token sampling: logit bias, penalties, min_tokens, temperature, top-k / top-p / min-p,
seeded draws.

Order per row: grammar mask (constrained rows) -> logit bias -> penalties -> min_tokens mask ->
[logprobs taken here] -> temperature -> top-k -> top-p (over the top-k renormalised distribution) ->
min-p -> draw. Greedy rows take the argmax after the min_tokens mask. A masked token is -inf, and
-inf plus any bias stays -inf: the bias added after the mask is the bias added before it.

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

from collections import Counter
from dataclasses import dataclass
from itertools import chain

import torch
from rillet.core.runner.base import SampleResult
from rillet.core.runner.sample_output import DeviceSample, pack_logprobs
from rillet.core.sampling_params import GREEDY_EPS
from rillet.core.sequence import Seq
from rillet.core.structured.masks import PendingMask

__all__ = ["DeviceSample", "SampleResult", "Sampler"]

_TOP_P_OFF = 2.0  # above any cumulative sum, so rounding past 1.0 never drops tail tokens
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
        """As `sample`, but the result stays on the device (sample_output.py): nothing waits for it.

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
        grammar mask either): the LM head may give candidates alone (DecoderModel.compute_logits)."""
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
