"""Prompt lookup: the tokens that followed the sequence's last n tokens earlier in its own text.

For n from ngram_max down to ngram_min, the suffix of the sequence's prompt + output of length n
is looked up among its earlier n-grams; the most recent earlier occurrence wins, and the (up to)
k tokens that followed it are the draft. Input-grounded work (rewriting, quoting, code edits,
JSON that repeats the prompt's fields) repeats long runs of its prompt, so the drafts are often
right; open chat rarely matches, and then nothing is drafted (the step is a plain decode).

Each sequence keeps an index per n: n-gram -> the position right after its latest occurrence,
extended with the tokens appended since the last lookup, so a lookup costs O(ngram_max) dict
operations whatever the sequence's length.
"""

from __future__ import annotations

from typing import Any

from rillet.core.sequence import Seq
from rillet.core.spec.drafter import Draft


class _Index:
    __slots__ = ("indexed", "maps")

    def __init__(self, sizes: range) -> None:
        self.maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        # n-grams [stop - n, stop) are indexed for every stop <= this; stop < length always (the
        # token at `stop` is what follows), so the sequence's own suffix never finds itself
        self.indexed = 0


class NgramDrafter:
    name = "ngram"
    wants_hidden = False
    cheap = True

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.sizes = range(ngram_min, ngram_max + 1)
        self._index: dict[int, _Index] = {}  # seq_id -> its n-gram index

    def propose(self, seqs: list[Seq], ks: list[int], hidden: Any = None) -> list[Draft]:
        return [self.lookup(seq, k) for seq, k in zip(seqs, ks, strict=True)]

    def lookup(self, seq: Seq, k: int) -> Draft:
        """Up to k tokens that followed the longest matching suffix, and that suffix's length."""
        length = seq.num_tokens
        if length < self.sizes.start + 1:
            return Draft([])
        idx = self._index.get(seq.seq_id)
        if idx is None:
            idx = self._index[seq.seq_id] = _Index(self.sizes)
        self._extend(seq, idx, length)
        for n in reversed(self.sizes):
            if n >= length:
                continue
            after = idx.maps[n].get(tuple(seq.tokens(length - n, length)))
            if after is not None:
                return Draft(seq.tokens(after, min(after + k, length)), n)
        return Draft([])

    def _extend(self, seq: Seq, idx: _Index, length: int) -> None:
        """Indexes the n-grams that some token follows and that are not indexed yet."""
        end = length - 1  # the last stop with a token after it
        if idx.indexed >= end:
            return
        lo = max(0, idx.indexed + 1 - self.sizes[-1])
        window = seq.tokens(lo, end)
        for stop in range(idx.indexed + 1, end + 1):  # later occurrences overwrite earlier ones
            for n, table in idx.maps.items():
                if stop - n >= 0:
                    table[tuple(window[stop - n - lo : stop - lo])] = stop
        idx.indexed = end

    def landed(self, seq: Seq) -> None:
        pass

    def release(self, seq: Seq) -> None:
        self._index.pop(seq.seq_id, None)

    def close(self) -> None:
        self._index.clear()
