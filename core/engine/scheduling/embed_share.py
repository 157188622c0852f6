"""scheduler.embed_share: while chat requests run, embeddings take at most this share of the engine.

One engine serves both (`model.task: both`), and an embedding is a prefill: on a GPU a few hundred
prefill tokens ride along a decode step almost for free, on a CPU each costs about as much as a
decode row, and any prefill row also takes the step off the compiled decode path. So the share is
kept in time, not tokens, with a credit: every step that runs generation rows alone earns
`share / (1 - share)` of its duration; a step that also runs embedding tokens spends what they cost
it (its duration minus a generation-alone step's, both measured: moving averages). Embeddings may
take `credit / seconds-per-token` tokens, and only in chunks of at least `MIN_CHUNK` tokens: mixed
steps are then rare and large (a 0.2 share means about one embedding chunk after every few chat
steps) rather than a few tokens in every step, each paying the eager step's overhead.
Without chat (none in the engine for GRACE_S) embeddings run at full speed, in steps of at most
MAX_STALL_S by their measured cost alone: a chat request that arrives waits for the step in
flight, and a whole token budget of prefill is seconds on a CPU (17 s on a loaded 2-core host,
measured), which cost chat ~0.3 of its speed in bench/serving/embeddings.py. Mixed steps are
bounded the same way, by the credit kept (at most MAX_STALL_S, or one MIN_CHUNK's cost where that
is more: else embeddings would starve while chat runs on a CPU where a chunk costs more).
Plain Python, on the engine thread.
"""

from __future__ import annotations

MIN_CHUNK = 64  # embedding tokens a mixed step carries at least (fewer: wait for more credit)
MAX_STALL_S = 0.25  # what a step may add for embeddings: credit kept, embedding-alone step length
FIRST_ALONE_CHUNK = 128  # embedding tokens of the first step without chat (then: measured)
_ALPHA = 0.2  # weight of the newest sample in the moving averages
_MIN_TOKEN_S = 1e-7
GRACE_S = 1.0  # the share holds this long after the last chat request left


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + _ALPHA * (new - old)


class EmbedShare:
    def __init__(self, share: float) -> None:
        assert 0 < share < 1
        self.ratio = share / (1 - share)  # embedding seconds earned per generation second
        self.credit = 0.0  # seconds of embedding work the next steps may still spend
        self.gen_step_s: float | None = None  # a step of decode rows alone (no prefill, no embedding)
        self.token_s: float | None = None  # what one embedding token adds to a step
        self.alone_token_s: float | None = None  # what one costs in a step without generation rows
        self._last_generation = -GRACE_S - 1.0  # when generation sequences were last present

    def cap(self, generation: bool, now: float) -> int:
        """Embedding tokens the next step may take (0: none). The share holds while
        generation sequences are in the engine and for GRACE_S after: chat clients that send their
        next request as soon as one ends leave the engine without chat for a moment, and a whole
        budget of embeddings must not fill that moment. Without chat: MAX_STALL_S worth."""
        if generation:
            self._last_generation = now
        elif now - self._last_generation > GRACE_S:
            if self.alone_token_s is None:
                return FIRST_ALONE_CHUNK
            return max(MIN_CHUNK, int(MAX_STALL_S / self.alone_token_s))
        if self.gen_step_s is None or self.credit <= 0:
            return 0
        if self.token_s is None:
            return MIN_CHUNK  # one mixed step measures the cost
        n = int(self.credit / self.token_s)
        return n if n >= MIN_CHUNK else 0

    def observe(self, seconds: float, embed_tokens: int, gen_rows: int, gen_tokens: int) -> None:
        """One step's duration and what it ran (rows and tokens of generation sequences)."""
        if gen_rows == 0:  # no chat in this step: a cost to measure, paid from credit kept (grace)
            if embed_tokens:
                self.alone_token_s = _ema(self.alone_token_s, max(seconds / embed_tokens, _MIN_TOKEN_S))
                self.credit = max(self.credit - seconds, 0.0)
            return
        decode_only = gen_tokens == gen_rows
        if embed_tokens == 0:
            if decode_only:
                self.gen_step_s = _ema(self.gen_step_s, seconds)
            ceiling = max(MAX_STALL_S, MIN_CHUNK * (self.token_s or 0.0))
            self.credit = min(self.credit + self.ratio * seconds, ceiling)
            return
        extra = max(seconds - (self.gen_step_s or 0.0), 0.0)
        self.credit -= extra
        if decode_only:
            # a floor: a step measured no slower than a chat step alone (timer noise) must not
            # make the next chunk unbounded (the step's token budget bounds it anyway)
            self.token_s = _ema(self.token_s, max(extra / embed_tokens, _MIN_TOKEN_S))
