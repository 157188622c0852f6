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
from rillet.core.sequence import TokenLogprob
from rillet.http.openai.errors import ApiError
from rillet.http.openai.logprobs import CompletionLogprobs, TokenTexts, chat_entries
from rillet.http.openai.tool_calls import Event, ToolCallParser, new_call_id

DONE = b"data: [DONE]\n\n"
_dumps = orjson.dumps


def sse_event(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


def error_event(err: ApiError) -> bytes:
    return sse_event(err.body())


class ChunkFormat:
    """OpenAI chat and completions chunks: the stream layer's `EventFormat` (stream/event_format.py)."""

    def __init__(
        self,
        chat: bool,
        request_id: str,
        created: int,
        model: str,
        num_choices: int,
        include_usage: bool,
        texts: TokenTexts,
        tools: bool = False,
        max_tool_calls: int | None = None,
        echo_texts: list[str] | None = None,
        n: int = 1,
    ) -> None:
        """`tools`: chat with tools offered; each choice's text is read for tool calls as it streams
        (at most `max_tool_calls` of them; None: any number). `echo_texts`: completions with echo,
        each prompt's text (n choices per prompt)."""
        self.chat = chat
        self._echo = echo_texts
        self._n = n
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
        self._text_tail = self._close + self._null_tail
        self._completion_lps = [CompletionLogprobs() for _ in range(num_choices)] if not chat else []
        self.tool_parsers = [ToolCallParser(max_tool_calls) for _ in range(num_choices)] if tools else None

    # ---- the EventFormat interface -------------------------------------------------------------
    def head(self) -> bytes:
        if self.chat:
            return self.role()
        return self.echo(self._echo, self._n) if self._echo else b""

    def piece(self, index: int, text: str, logprobs: list[TokenLogprob] | None) -> bytes:
        if self.tool_parsers is not None:
            return b"".join(self.tool_text(index, text))
        if logprobs is None:
            if not text:  # an empty text (held-back stop prefix) is no event
                return b""
            return self._content_prefix[index] + _dumps(text) + self._text_tail
        return self.content(index, text, logprobs)

    def text_parts(self, index: int, text: str) -> tuple[bytes, bytes, bytes] | None:
        """The fast path's event for a plain piece: `piece`'s bytes as (envelope head, the text as
        JSON, envelope tail), which the writer joins once, framing included
        (stream/transport_write.py); None with tools (their parser decides what is content)."""
        if self.tool_parsers is not None:
            return None
        return self._content_prefix[index], _dumps(text), self._text_tail

    def end(self, usage: Usage) -> bytes:
        return self.usage(usage.body()) + DONE if self.include_usage else DONE

    def error(self, err: ApiError) -> bytes:
        return error_event(err) + DONE

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
        return self._content_prefix[index] + _dumps(text) + self._text_tail

    def content(self, index: int, text: str, logprobs: list[TokenLogprob] | None) -> bytes:
        if logprobs is None:
            return self.text_event(index, text)
        return (
            self._content_prefix[index]
            + _dumps(text)
            + self._close
            + b',"logprobs":'
            + _dumps(self._logprobs(index, logprobs))
            + b',"finish_reason":null}]'
            + self._usage_field
            + b"}\n\n"
        )

    def finish(self, index: int, reason: str, stop_str: str | None = None) -> bytes:
        head = b""
        if self.tool_parsers is not None:
            parser = self.tool_parsers[index]
            head = b"".join(self._tool_events(index, parser.finish()))
            if parser.calls and reason == "stop" and parser.closed == parser.calls:
                reason = "tool_calls"  # not for a call whose arguments never ended
        body = b',"delta":{}' if self.chat else b',"text":""'
        tail = b',"logprobs":null,"finish_reason":"' + reason.encode() + b'"}]' + self._usage_field + b"}\n\n"
        return head + self._choice_head[index] + body + tail

    def tool_text(self, index: int, text: str) -> list[bytes]:
        """A piece of a choice's text, read for tool calls: content and `delta.tool_calls` events."""
        assert self.tool_parsers is not None
        return self._tool_events(index, self.tool_parsers[index].feed(text))

    def _tool_events(self, index: int, events: list[Event]) -> list[bytes]:
        out: list[bytes] = []
        parser = self.tool_parsers[index] if self.tool_parsers is not None else None
        calls = parser.calls - sum(1 for kind, _ in events if kind == "call") if parser else 0
        for kind, value in _merged(events):
            if kind == "content":
                out.append(self.text_event(index, value))
                continue
            if kind == "call":
                calls += 1
                call: dict[str, Any] = {
                    "index": calls - 1,
                    "id": new_call_id(),
                    "type": "function",
                    "function": {"name": value, "arguments": ""},
                }
            else:
                call = {"index": calls - 1, "function": {"arguments": value}}
            delta = b',"delta":{"tool_calls":[' + _dumps(call) + b"]}"
            out.append(self._choice_head[index] + delta + self._null_tail)
        return out

    def usage(self, usage: dict[str, Any]) -> bytes:
        return sse_event({**self._envelope, "choices": [], "usage": usage})

    def _logprobs(self, index: int, lps: list[TokenLogprob]) -> dict[str, Any]:
        if self.chat:
            return {"content": chat_entries(lps, self.texts)}
        return self._completion_lps[index].columns(lps, self.texts)


def _merged(events: list[Event]) -> list[Event]:
    """Neighbouring content or argument pieces joined: one SSE event each."""
    out: list[Event] = []
    for kind, value in events:
        if out and kind != "call" and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


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
