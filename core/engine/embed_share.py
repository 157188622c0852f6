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
Plain Python, on the engine thread. Without chat (none in the engine for GRACE_S) embeddings run
at full speed.
"""

from __future__ import annotations

MIN_CHUNK = 64  # embedding tokens a mixed step carries at least (fewer: wait for more credit)
_MAX_CREDIT_S = 0.5  # credit kept at most: bounds one mixed step's extra time (a chat stall)
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
        self._last_generation = -GRACE_S - 1.0  # when generation sequences were last present

    def cap(self, generation: bool, now: float) -> int | None:
        """Embedding tokens the next step may take (0: none; None: no limit). The limit holds while
        generation sequences are in the engine and for GRACE_S after: chat clients that send their
        next request as soon as one ends leave the engine without chat for a moment, and a whole
        budget of embeddings must not fill that moment."""
        if generation:
            self._last_generation = now
        elif now - self._last_generation > GRACE_S:
            return None
        if self.gen_step_s is None or self.credit <= 0:
            return 0
        if self.token_s is None:
            return MIN_CHUNK  # one mixed step measures the cost
        n = int(self.credit / self.token_s)
        return n if n >= MIN_CHUNK else 0

    def observe(self, seconds: float, embed_tokens: int, gen_rows: int, gen_tokens: int) -> None:
        """One step's duration and what it ran (rows and tokens of generation sequences)."""
        if gen_rows == 0:
            return  # no chat in this step: nothing to share with
        decode_only = gen_tokens == gen_rows
        if embed_tokens == 0:
            if decode_only:
                self.gen_step_s = _ema(self.gen_step_s, seconds)
            self.credit = min(self.credit + self.ratio * seconds, _MAX_CREDIT_S)
            return
        extra = max(seconds - (self.gen_step_s or 0.0), 0.0)
        self.credit -= extra
        if decode_only:
            # a floor: a step measured no slower than a chat step alone (timer noise) must not
            # make the next chunk unbounded (the step's token budget bounds it anyway)
            self.token_s = _ema(self.token_s, max(extra / embed_tokens, _MIN_TOKEN_S))
