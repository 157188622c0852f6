"""The fake engine's sequences (fake_engine.py): one choice of a request, its output so far, and
the delta it emits each step. Greedy output cycles through `TEXT` from the sequence's offset, one
byte a token; stop strings, stop ids, min_tokens and max_tokens end it as the engine's rules do
(a tail that may still become a stop string held back); with a scripted reply it answers that,
one byte a token, then EOS."""

from __future__ import annotations

from dataclasses import dataclass, field

from rillet.core.errors import ErrorKind
from rillet.core.outputs import SeqDelta
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, TokenLogprob

from http_doubles.byte_tokenizer import EOS

TEXT = b"The quick brown fox jumps over the lazy dog. "


@dataclass
class FakeSeq:
    request_id: str
    index: int
    prompt_len: int
    params: SamplingParams
    deadline: float | None
    offset: int
    fail_after: int | None = None
    out: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0  # chars of `text` already published; -1 once finished

    def next_delta(self) -> SeqDelta:
        """The next byte of TEXT, and what it ends (a stop string or id, max_tokens)."""
        p = self.params
        tok = TEXT[(self.offset + len(self.out)) % len(TEXT)]
        self.out.append(tok)
        self.text += chr(tok)
        reason = None
        stop_str = None
        cut = len(self.text)
        stops = [(self.text.find(x, max(0, self.emitted - len(x))), x) for x in p.stop]
        hits = [(i, x) for i, x in stops if i >= 0]
        if hits and len(self.out) >= p.min_tokens:
            i, x = min(hits)
            cut, reason = (i + len(x) if p.include_stop_str_in_output else i), FinishReason.STOP
            stop_str = x
        elif tok in p.stop_token_ids and len(self.out) >= p.min_tokens:
            reason = FinishReason.STOP
        elif len(self.out) >= p.max_tokens:
            reason = FinishReason.LENGTH
        else:  # hold back a tail that may still become a stop string
            hold = max((k for x in p.stop for k in range(1, len(x)) if self.text.endswith(x[:k])), default=0)
            cut = len(self.text) - hold
        text = self.text[self.emitted : max(cut, self.emitted)]
        self.emitted = -1 if reason is not None else max(cut, self.emitted)
        lps = None
        if p.logprobs is not None:
            top = [(tok, -0.25), *((t, -2.0 - j) for j, t in enumerate(b"xyz"))][: p.logprobs]
            lps = [TokenLogprob(tok, -0.25, top)]
        return self.delta([tok], text, lps, reason, None, stop_str=stop_str)

    def scripted(self, reply: bytes) -> SeqDelta:
        """The next byte of `reply`, EOS after its last."""
        done = len(self.out) >= len(reply)
        tok = EOS if done else reply[len(self.out)]
        self.out.append(tok)
        if done:
            self.emitted = -1
            return self.delta([tok], "", None, FinishReason.STOP, None)
        reason = FinishReason.LENGTH if len(self.out) >= self.params.max_tokens else None
        if reason is not None:
            self.emitted = -1
        return self.delta([tok], chr(tok), None, reason, None)

    def delta(
        self,
        ids: list[int],
        text: str,
        lps: list[TokenLogprob] | None,
        reason: FinishReason | None,
        error: str | None,
        kind: ErrorKind | None = None,
        stop_str: str | None = None,
    ) -> SeqDelta:
        return SeqDelta(
            self.request_id,
            self.index,
            ids,
            text,
            lps,
            reason,
            self.prompt_len,
            0,
            len(self.out),
            error,
            kind,
            stop_str,
        )
