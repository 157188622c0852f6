"""SSE chunk bytes for one streaming request, with the constant parts encoded once.

A content event is `prefix[index] + orjson(text) + suffix`: the envelope (id, object, created,
model) and the null logprobs / finish_reason tail never change within a request, so the per-token
work is one orjson call on the text and one bytes join, no dict building.

  chat:  data: {"id":..,"object":"chat.completion.chunk",..,"choices":[{"index":I,
                "delta":{"content":T},"logprobs":null,"finish_reason":null}]}
  text:  data: {"id":..,"object":"text_completion",..,"choices":[{"index":I,
                "text":T,"logprobs":null,"finish_reason":null}]}
"""

from __future__ import annotations

from typing import Any

import orjson

from .coalesce import Piece
from .errors import ApiError
from .logprobs import CompletionLogprobs, TokenTexts, chat_entries

DONE = b"data: [DONE]\n\n"
_dumps = orjson.dumps


def sse_event(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


def error_event(err: ApiError) -> bytes:
    return sse_event(err.body())


class ChunkFormat:
    def __init__(
        self,
        chat: bool,
        request_id: str,
        created: int,
        model: str,
        num_choices: int,
        include_usage: bool,
        texts: TokenTexts,
    ) -> None:
        self.chat = chat
        self.texts = texts
        self.include_usage = include_usage
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._envelope = {"id": request_id, "object": obj, "created": created, "model": model}
        head = b'data: {"id":' + _dumps(request_id) + b',"object":"' + obj.encode()
        head += b'","created":' + str(created).encode() + b',"model":' + _dumps(model)
        self._usage_field = b',"usage":null' if include_usage else b""
        self._choice_head = [head + b',"choices":[{"index":' + str(i).encode() for i in range(num_choices)]
        key = b',"delta":{"content":' if chat else b',"text":'
        self._content_prefix = [h + key for h in self._choice_head]
        self._close = b"}" if chat else b""
        self._null_tail = b',"logprobs":null,"finish_reason":null}]' + self._usage_field + b"}\n\n"
        self._completion_lps = [CompletionLogprobs() for _ in range(num_choices)] if not chat else []

    # ---- events ------------------------------------------------------------------------------
    def role(self) -> bytes:
        """Chat: the first chunk of every choice carries the role."""
        return b"".join(
            h + b',"delta":{"role":"assistant","content":""}' + self._null_tail for h in self._choice_head
        )

    def echo(self, texts: list[str], n: int) -> bytes:
        """Completions with echo: each choice starts with its prompt's text."""
        return b"".join(self.text_event(i, texts[i // n]) for i in range(len(self._choice_head)))

    def text_event(self, index: int, text: str) -> bytes:
        return self._content_prefix[index] + _dumps(text) + self._close + self._null_tail

    def content(self, piece: Piece) -> bytes:
        if piece.logprobs is None:
            return self.text_event(piece.index, piece.text)
        return (
            self._content_prefix[piece.index]
            + _dumps(piece.text)
            + self._close
            + b',"logprobs":'
            + _dumps(self._logprobs(piece))
            + b',"finish_reason":null}]'
            + self._usage_field
            + b"}\n\n"
        )

    def finish(self, index: int, reason: str) -> bytes:
        body = b',"delta":{}' if self.chat else b',"text":""'
        tail = b',"logprobs":null,"finish_reason":"' + reason.encode() + b'"}]' + self._usage_field + b"}\n\n"
        return self._choice_head[index] + body + tail

    def usage(self, usage: dict[str, Any]) -> bytes:
        return sse_event({**self._envelope, "choices": [], "usage": usage})

    def _logprobs(self, piece: Piece) -> dict[str, Any]:
        lps = piece.logprobs or []
        if self.chat:
            return {"content": chat_entries(lps, self.texts)}
        return self._completion_lps[piece.index].columns(lps, self.texts)


class Usage:
    """Token counts of a request, kept current from its deltas (prompt counted once per prompt)."""

    __slots__ = ("_cached", "_completion", "n", "prompt_tokens")

    def __init__(self, prompt_lens: list[int], n: int) -> None:
        self.n = n
        self.prompt_tokens = sum(prompt_lens)
        self._completion = [0] * (len(prompt_lens) * n)
        self._cached = [0] * len(prompt_lens)

    def update(self, index: int, completion_tokens: int, cached_tokens: int) -> None:
        self._completion[index] = completion_tokens
        if index % self.n == 0:
            self._cached[index // self.n] = cached_tokens

    @property
    def completion_tokens(self) -> int:
        return sum(self._completion)

    def body(self) -> dict[str, Any]:
        done = self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
            "prompt_tokens_details": {"cached_tokens": sum(self._cached)},
        }
