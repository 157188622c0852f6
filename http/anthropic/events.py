"""Anthropic Messages stream events for one request: the stream layer's `EventFormat`.

  message_start (the message, empty content, input token count), ping           (head)
  content_block_start (text), content_block_delta (text_delta) ..., content_block_stop
  content_block_start (tool_use: id, name, input {}), content_block_delta (input_json_delta) ...,
  content_block_stop                                                             (each call)
  message_delta (stop_reason, stop_sequence, usage), message_stop               (end)
  error                                                                          (a failure)

Each is `event: <type>` then its JSON. With tools offered the text is read for tool calls as it
streams (openai/tool_calls.py; at most `max_calls` of them); whitespace before a first call opens
no text block. The non-streaming answer is this format's blocks over the whole text
(`message_body`), in the stream's order. Keep-alive `ping`s while idle: keepalive.py.
"""

from __future__ import annotations

from typing import Any

import orjson
from rillet.core.sequence import TokenLogprob
from rillet.http.anthropic.bodies import new_id, stop_reason, tool_input, usage_body
from rillet.http.anthropic.errors import error_body
from rillet.http.openai.bodies import ChoiceResult
from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import ApiError
from rillet.http.openai.tool_calls import Event, ToolCallParser
from rillet.http.openai.tool_prompt import call_text

_dumps = orjson.dumps
PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_TEXT_DELTA = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
_TEXT_DELTA_KEY = b'"delta":{"type":"text_delta","text":'


def _event(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + _dumps(obj) + b"\n\n"


class MessagesFormat:
    def __init__(
        self, mid: str, model: str, prompt_tokens: int, tools: bool, max_calls: int | None = None
    ) -> None:
        """`max_calls`: tool calls answered at most (disable_parallel_tool_use: 1; None: any)."""
        self._mid = mid
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._parser = ToolCallParser(max_calls) if tools else None
        # the blocks as sent: [kind, text or name, the tool_use's id and argument fragments]
        self._content: list[tuple[str, list[str], str]] = []
        self._blocks = 0  # blocks opened so far (the next block's index)
        self._open: str | None = None  # "text" | "tool_use" | None
        self._text_prefix = b""
        self._held = ""  # whitespace that may precede a first call: no block yet
        self._calls = 0
        self._stop: tuple[str, str | None] = ("end_turn", None)

    # ---- the EventFormat interface -------------------------------------------------------------
    def head(self) -> bytes:
        message: dict[str, Any] = {
            "id": self._mid,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._prompt_tokens, "output_tokens": 0},
        }
        return _event({"type": "message_start", "message": message}) + PING

    def piece(self, index: int, text: str, logprobs: list[TokenLogprob] | None) -> bytes:
        if self._parser is None:
            return self._text(text) if text else b""
        return b"".join(self._events(self._parser.feed(text)))

    def text_parts(self, index: int, text: str) -> tuple[bytes, bytes, bytes] | None:
        """Inside an open text block (the first piece opens it through `piece`); never with tools."""
        if self._parser is not None or self._open != "text":
            return None
        return self._text_prefix, _dumps(text), b"}}\n\n"

    def finish(self, index: int, reason: str, stop_str: str | None) -> bytes:
        out: list[bytes] = []
        if self._parser is not None:
            out += self._events(self._parser.finish())
            if self._parser.cut and reason == "length":
                self._calls -= 1  # the last call never finished: not a tool_use stop
                self._content.pop()  # nor an answered call
        if self._blocks == 0:
            out.append(self._text(self._held))  # the answer's only text (maybe none): its block
        out.append(self._close())
        reason_out = stop_reason(reason, stop_str, self._calls > 0)
        self._stop = (reason_out, stop_str if reason_out == "stop_sequence" else None)
        return b"".join(out)

    def end(self, usage: Usage) -> bytes:
        reason, sequence = self._stop
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_body(usage),
        }
        return _event(delta) + _event({"type": "message_stop"})

    def error(self, err: ApiError) -> bytes:
        return _event(error_body(err))

    # ---- blocks -----------------------------------------------------------------------------------
    def _events(self, events: list[Event]) -> list[bytes]:
        out: list[bytes] = []
        for kind, value in events:
            if kind == "content":
                if self._open != "text":
                    self._held += value
                    if not self._held.strip():
                        continue  # whitespace so far: a call may follow
                    value, self._held = self._held, ""
                out.append(self._text(value))
            elif kind == "call":
                self._held = ""
                self._calls += 1
                out.append(self._close())
                tool_id = new_id("toolu")
                block = {"type": "tool_use", "id": tool_id, "name": value, "input": {}}
                out.append(self._start(block, "tool_use"))
                self._content.append(("tool_use", [value], tool_id))
            else:
                self._content[-1][1].append(value)
                delta = {"type": "input_json_delta", "partial_json": value}
                out.append(_event({"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}))
        return out

    def _text(self, text: str) -> bytes:
        head = b""
        if self._open != "text":
            head = self._close() + self._start({"type": "text", "text": ""}, "text")
            self._text_prefix = (_TEXT_DELTA % (self._blocks - 1)) + _TEXT_DELTA_KEY
            self._content.append(("text", [], ""))
        if not text:
            return head
        self._content[-1][1].append(text)
        return head + self._text_prefix + _dumps(text) + b"}}\n\n"

    def _start(self, block: dict[str, Any], kind: str) -> bytes:
        self._open = kind
        self._blocks += 1
        return _event({"type": "content_block_start", "index": self._blocks - 1, "content_block": block})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event({"type": "content_block_stop", "index": self._blocks - 1})

    # ---- the non-streaming answer ------------------------------------------------------------------
    def blocks(self) -> tuple[list[dict[str, Any]], bool]:
        """The content blocks sent, whole, and whether one is a call. A call whose arguments are not
        a JSON object cannot be a tool_use block: it is given back as text."""
        out: list[dict[str, Any]] = []
        calls = False
        for kind, parts, tool_id in self._content:
            if kind == "tool_use":
                value = tool_input("".join(parts[1:]))
                if value is not None:
                    out.append({"type": "tool_use", "id": tool_id, "name": parts[0], "input": value})
                    calls = True
                    continue
                text = call_text(parts[0], "".join(parts[1:]))
            else:
                text = "".join(parts)
            if out and out[-1]["type"] == "text":
                out[-1]["text"] += text
            else:
                out.append({"type": "text", "text": text})
        return out, calls


def message_body(
    mid: str, model: str, result: ChoiceResult, usage: Usage, tools: bool, max_calls: int | None = None
) -> dict[str, Any]:
    """The non-streaming answer: the stream's blocks over the whole text (the events are dropped)."""
    fmt = MessagesFormat(mid, model, usage.prompt_tokens, tools, max_calls)
    fmt.piece(0, result.text, None)
    fmt.finish(0, result.finish_reason or "stop", result.stop_str)
    content, calls = fmt.blocks()
    if calls and not "".join(b["text"] for b in content if b["type"] == "text").strip():
        content = [b for b in content if b["type"] != "text"]  # no whitespace-only text beside calls
    stop = stop_reason(result.finish_reason, result.stop_str, calls)
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": result.stop_str if stop == "stop_sequence" else None,
        "usage": usage_body(usage),
    }
