"""The Responses API's semantic stream events for one request: the stream layer's `EventFormat`.

  response.created, response.in_progress                         (head)
  response.output_item.added (message), response.content_part.added (output_text),
  response.output_text.delta ...                                  (text, as it comes)
  response.output_text.done, response.content_part.done, response.output_item.done
  response.output_item.added (function_call), response.function_call_arguments.delta ...,
  response.function_call_arguments.done, response.output_item.done   (each tool call)
  response.completed | response.incomplete (max_output_tokens)   (end, with usage)
  error, response.failed                                          (a failure mid-stream)

Every event carries its `sequence_number`. With tools offered the text is read for tool calls as it
streams (openai/tool_calls.py, as chat does; at most `max_calls` of them); whitespace before a first
call opens no message item. The non-streaming answer's output is this format's over the whole text
(`answer_output`), so its items, their order and statuses are the stream's. A text delta is a
constant prefix, one orjson call on the text and the sequence number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from rillet.core.sequence import TokenLogprob
from rillet.http.openai.bodies import ChoiceResult
from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import ApiError
from rillet.http.openai.tool_calls import Event, ToolCallParser, new_call_id
from rillet.http.responses.bodies import (
    call_item,
    message_item,
    new_id,
    output_text,
    response_object,
    status_of,
    usage_body,
)

_dumps = orjson.dumps


@dataclass
class _Item:
    """The output item being streamed."""

    kind: str  # "message" | "function_call"
    item_id: str
    index: int  # output_index
    parts: list[str] = field(default_factory=list)  # text, or the arguments' fragments
    call_id: str = ""
    name: str = ""
    delta_prefix: bytes = b""


class ResponsesFormat:
    def __init__(
        self,
        rid: str,
        created: int,
        model: str,
        echo: dict[str, Any],
        tools: bool,
        on_done: Callable[[dict[str, Any]], None] | None = None,
        max_calls: int | None = None,
    ) -> None:
        """`on_done(response)`: called with the final response object (the store keeps it).
        `max_calls`: tool calls answered at most (parallel_tool_calls false: 1; None: any)."""
        self._envelope = (rid, created, model, echo)
        self._on_done = on_done
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # finished items
        self._open: _Item | None = None
        self._parser = ToolCallParser(max_calls) if tools else None
        self._held = ""  # whitespace that may precede a first call: no item yet
        self._finish: str | None = None

    # ---- the EventFormat interface -------------------------------------------------------------
    def head(self) -> bytes:
        response = self._response("in_progress", [], None)
        return self._emit({"type": "response.created", "response": response}) + self._emit(
            {"type": "response.in_progress", "response": response}
        )

    def piece(self, index: int, text: str, logprobs: list[TokenLogprob] | None) -> bytes:
        if self._parser is None:
            return self._text(text) if text else b""
        return b"".join(self._events(self._parser.feed(text)))

    def text_parts(self, index: int, text: str) -> tuple[bytes, bytes, bytes] | None:
        """Inside an open message item (the first piece opens it through `piece`); never with
        tools. A text delta carries the next sequence number, so a non-empty text is taken here
        as `piece` would take it."""
        item = self._open
        if self._parser is not None or item is None or item.kind != "message":
            return None
        if not text:
            return b"", b"", b""  # no event, nothing taken
        item.parts.append(text)
        n = self._seq
        self._seq += 1
        return item.delta_prefix, _dumps(text), b',"logprobs":[],"sequence_number":%d}\n\n' % n

    def finish(self, index: int, reason: str, stop_str: str | None) -> bytes:
        self._finish = reason
        out: list[bytes] = []
        cut = False
        if self._parser is not None:
            out += self._events(self._parser.finish())
            cut = self._parser.cut
        if self._open is None and (self._held or not self._output):
            out.append(self._text(self._held))  # the answer's only text (maybe none): its message
        length = reason == "length"
        is_message = self._open is not None and self._open.kind == "message"
        out.append(self._close("incomplete" if length and (is_message or cut) else "completed"))
        return b"".join(out)

    def end(self, usage: Usage) -> bytes:
        status = status_of(self._output, self._finish)
        response = self._response(status, self._output, usage_body(usage))
        if self._on_done is not None:
            self._on_done(response)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return self._emit({"type": kind, "response": response})

    def error(self, err: ApiError) -> bytes:
        """The item being streamed ends `incomplete` (its `output_item.done`), then the error and
        `response.failed` with the output so far."""
        closed = self._close("incomplete")
        error = {"type": "error", "code": err.code or err.type, "message": err.message, "param": err.param}
        failed = self._response(
            "failed", self._output, None, {"code": err.code or err.type, "message": err.message}
        )
        return closed + self._emit(error) + self._emit({"type": "response.failed", "response": failed})

    @property
    def output(self) -> list[dict[str, Any]]:
        """The finished output items so far."""
        return list(self._output)

    # ---- items -----------------------------------------------------------------------------------
    def _events(self, events: list[Event]) -> list[bytes]:
        out: list[bytes] = []
        for kind, value in events:
            if kind == "content":
                if self._open is None or self._open.kind != "message":
                    self._held += value
                    if not self._held.strip():
                        continue  # whitespace so far: a call may follow
                    value, self._held = self._held, ""
                out.append(self._text(value))
            elif kind == "call":
                self._held = ""
                out.append(self._close("completed"))
                out.append(self._open_call(value))
            else:
                item = self._open
                assert item is not None and item.kind == "function_call"
                item.parts.append(value)
                out.append(
                    self._emit(
                        {
                            "type": "response.function_call_arguments.delta",
                            "item_id": item.item_id,
                            "output_index": item.index,
                            "delta": value,
                        }
                    )
                )
        return out

    def _text(self, text: str) -> bytes:
        item = self._open
        head = b""
        if item is None or item.kind != "message":
            head = self._close("completed") + self._open_message()
            item = self._open
            assert item is not None
        if not text:
            return head
        item.parts.append(text)
        n = self._seq
        self._seq += 1
        return head + item.delta_prefix + _dumps(text) + b',"logprobs":[],"sequence_number":%d}\n\n' % n

    def _open_message(self) -> bytes:
        item = _Item("message", new_id("msg"), len(self._output))
        item.delta_prefix = (
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":'
            + _dumps(item.item_id)
            + b',"output_index":%d,"content_index":0,"delta":' % item.index
        )
        self._open = item
        added = {
            "id": item.item_id,
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        return self._emit(
            {"type": "response.output_item.added", "output_index": item.index, "item": added}
        ) + self._emit(
            {
                "type": "response.content_part.added",
                "item_id": item.item_id,
                "output_index": item.index,
                "content_index": 0,
                "part": output_text(""),
            }
        )

    def _open_call(self, name: str) -> bytes:
        item = _Item("function_call", new_id("fc"), len(self._output), call_id=new_call_id(), name=name)
        self._open = item
        added = call_item(item.item_id, item.call_id, name, "", "in_progress")
        return self._emit({"type": "response.output_item.added", "output_index": item.index, "item": added})

    def _close(self, status: str) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        text = "".join(item.parts)
        where = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "message":
            done = message_item(item.item_id, text, status)
            out = self._emit(
                {
                    "type": "response.output_text.done",
                    **where,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }
            )
            out += self._emit(
                {"type": "response.content_part.done", **where, "content_index": 0, "part": output_text(text)}
            )
        else:
            done = call_item(item.item_id, item.call_id, item.name, text, status)
            out = self._emit(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": item.name,
                    "arguments": text,
                }
            )
        self._output.append(done)
        return out + self._emit(
            {"type": "response.output_item.done", "output_index": item.index, "item": done}
        )

    # ---- envelope ----------------------------------------------------------------------------------
    def _response(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, error: Any = None
    ) -> dict[str, Any]:
        rid, created, model, echo = self._envelope
        return response_object(rid, created, model, echo, status, list(output), usage, error)

    def _emit(self, obj: dict[str, Any]) -> bytes:
        obj["sequence_number"] = self._seq
        self._seq += 1
        return b"event: " + obj["type"].encode() + b"\ndata: " + _dumps(obj) + b"\n\n"


def answer_output(result: ChoiceResult, tools: bool, max_calls: int | None = None) -> list[dict[str, Any]]:
    """The output items of a finished answer (the non-streaming path): the stream's, built by
    formatting the whole text at once (the events themselves are dropped)."""
    fmt = ResponsesFormat("", 0, "", {}, tools, max_calls=max_calls)
    fmt.piece(0, result.text, None)
    fmt.finish(0, result.finish_reason or "stop", result.stop_str)
    return fmt.output
