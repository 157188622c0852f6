"""Reading tool calls out of generated text, incrementally: `<tool_call>{"name": ..., "arguments": ...}
</tool_call>` blocks (tool_prompt.py's format) become calls; the rest is content.

One parser serves both paths, so a streamed answer's pieces concatenate to the non-streamed one:
streaming feeds each piece of text as it arrives and sends the events at once; non-streaming feeds
the whole text. Events: `("content", text)`, `("call", name)` (a call starts; its arguments follow),
`("args", fragment)` (the raw JSON text of the arguments, as generated). Text that might still turn
out to be the start of a `<tool_call>` tag is held back, as stop strings are. A call starts (and
streams) once its arguments open as a JSON object; a block the parser cannot read so (other keys
first, arguments of another JSON type, not JSON) is parsed whole once it closes: a call if its
arguments are an object (or a string holding one), else given back as content.

A call is a call once its arguments value has ended, in both paths, since a stream cannot take
back what it sent: one cut by max_tokens is not (non-streamed: `complete()` leaves it out;
streamed, where its fragments are out already, the finish reason stays `length`, which the SDKs'
accumulators raise on). Arguments that end but are not valid JSON are passed on as generated, as
OpenAI's API does. With `max_calls` (parallel_tool_calls false: 1) the text after the last
allowed call is dropped.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Literal

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')
_MAX_HEAD = 4096  # an opened block that neither reads as a call nor closes within this is content

Event = tuple[Literal["content", "call", "args"], str]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class _Args:
    """Where the arguments value ends: JSON depth and string state over the raw text."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False

    def scan(self, text: str) -> int:
        """Index just past the end of the value in `text`, or -1 if it goes on."""
        for i, ch in enumerate(text):
            if not self.started:
                if ch.isspace():
                    continue
                self.started = True
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
                continue
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    return i + 1
            elif ch == "," and self.depth == 0:
                return i
        return -1


@dataclass
class ToolCallParser:
    max_calls: int | None = None  # None: any number
    state: Literal["text", "head", "args", "tail", "done"] = "text"
    buf: str = ""
    calls: int = 0  # calls started so far
    closed: int = 0  # of those, calls whose arguments value ended
    after_call: bool = False  # newlines right after a closed call separate calls: not content
    cut: bool = False  # set by finish(): the text ended inside the last call's arguments
    _args: _Args = field(default_factory=_Args)

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while True:
            before = (self.state, len(self.buf))
            if self.state == "text":
                self._text(out)
            elif self.state == "head":
                self._head(out)
            elif self.state == "args":
                self._args_state(out)
            elif self.state == "tail":
                self._tail(out)
            else:  # done: max_calls reached, the rest is dropped
                self.buf = ""
            if (self.state, len(self.buf)) == before:
                return out

    def finish(self) -> list[Event]:
        """The end of the text: whatever is held goes out, but a call cut before its arguments (an
        object opened after the tag) is no more a call than one cut inside them, nor content: the
        tag and its half head are the call format's, never the answer's text."""
        out: list[Event] = []
        if self.state == "text" and self.buf:
            out.append(("content", self.buf))
        elif self.state == "head" and not self.buf.lstrip().startswith("{"):
            out += self._whole_block(self.buf, closed=False)
        self.cut = self.state == "args"
        self.buf, self.state = "", "text"
        return out

    # ---- states ------------------------------------------------------------------------------
    def _text(self, out: list[Event]) -> None:
        if self.after_call:
            self.buf = self.buf.lstrip("\n")
            if not self.buf:
                return
            self.after_call = False
        at = self.buf.find(OPEN)
        if at >= 0:
            if at:
                out.append(("content", self.buf[:at]))
            if self.max_calls is not None and self.calls >= self.max_calls:
                self.buf, self.state = "", "done"
                return
            self.buf, self.state = self.buf[at + len(OPEN) :], "head"
            return
        keep = _held(self.buf)
        if len(self.buf) > keep:
            out.append(("content", self.buf[: len(self.buf) - keep]))
            self.buf = self.buf[len(self.buf) - keep :]

    def _head(self, out: list[Event]) -> None:
        m = _HEAD.match(self.buf)
        if m is not None:
            self.calls += 1
            out.append(("call", json.loads(m.group(1))))
            self.buf, self.state, self._args = self.buf[m.end() :], "args", _Args()
            return
        end = self.buf.find(CLOSE)
        if end >= 0:  # a block in another shape: read it whole
            out += self._whole_block(self.buf[:end], closed=True)
            self.buf, self.state, self.after_call = self.buf[end + len(CLOSE) :], "text", True
        elif len(self.buf) > _MAX_HEAD:
            out.append(("content", OPEN + self.buf))  # not a call and never closing: give it back
            self.buf, self.state = "", "text"

    def _args_state(self, out: list[Event]) -> None:
        if not self._args.started:
            self.buf = self.buf.lstrip()
        end = self._args.scan(self.buf)
        piece = self.buf if end < 0 else self.buf[:end]
        if piece:
            out.append(("args", piece))
        if end < 0:
            self.buf = ""
        else:
            self.buf, self.state = self.buf[end:], "tail"
            self.closed += 1

    def _tail(self, out: list[Event]) -> None:
        end = self.buf.find(CLOSE)
        if end >= 0:
            self.buf, self.state, self.after_call = self.buf[end + len(CLOSE) :], "text", True
        elif len(self.buf) > len(CLOSE) + 64:  # a closing tag went missing: what follows is content
            self.buf, self.state = self.buf.lstrip(" }\n"), "text"

    def _whole_block(self, body: str, closed: bool) -> list[Event]:
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments", obj.get("parameters", {}))
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            if is_json_object(text):
                self.calls += 1
                self.closed += 1
                return [("call", obj["name"]), ("args", text)]
        return [("content", OPEN + body + (CLOSE if closed else ""))]


def _held(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of the opening tag."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            return k
    return 0


@dataclass
class ParsedCalls:
    content: str
    calls: list[tuple[str, str]]  # every call started, in order: (name, arguments text as generated)
    cut: bool = False  # the text ended inside the last call's arguments

    def complete(self) -> list[tuple[str, str]]:
        """The calls to answer as calls: those whose arguments value ended, as the stream's finish
        counts them (a call cut by the length limit never is: a client must never run it)."""
        return self.calls[:-1] if self.cut else self.calls

    @property
    def dropped(self) -> int:
        """Calls left out of `complete()`."""
        return len(self.calls) - len(self.complete())


def parse_all(text: str, max_calls: int | None = None) -> ParsedCalls:
    """The non-streaming path: the whole answer at once."""
    p = ToolCallParser(max_calls)
    parsed = collect_events(p.feed(text) + p.finish())
    parsed.cut = p.cut
    return parsed


def collect_events(events: list[Event]) -> ParsedCalls:
    content: list[str] = []
    calls: list[list[str]] = []
    for kind, value in events:
        if kind == "content":
            content.append(value)
        elif kind == "call":
            calls.append([value, ""])
        else:
            calls[-1][1] += value
    return ParsedCalls("".join(content), [(n, a) for n, a in calls])


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
