"""pump_sse's direct path: while the socket is free, a routing pass writes its tokens itself
without waking the pump, the pump takes over when the client stops reading, and the end always
goes through the pump; no direct path with a gathering delay, nor for a request's failure."""

from __future__ import annotations

import asyncio

from fake_engine import FakeTokenizer
from http_doubles.stream_deltas import chat_format as _fmt
from http_doubles.stream_deltas import contents as _contents
from http_doubles.stream_deltas import delta, settle
from http_doubles.stream_deltas import push as _push
from http_helpers import sse_events
from rillet.core.config import StreamConfig
from rillet.core.sequence import FinishReason
from rillet.http.openai.chunks import ChunkFormat, Usage
from rillet.http.openai.logprobs import TokenTexts
from rillet.http.stream.request_stream import RequestStream
from rillet.http.stream.sse import pump_sse


class FakeDirect:
    """A transport whose socket is free until told otherwise."""

    def __init__(self) -> None:
        self.free = True
        self.writes: list[bytes] = []

    def ready(self) -> bool:
        return self.free

    def __call__(self, data: bytes) -> None:
        self.writes.append(data)

    def frame(self, head: bytes, body: bytes, tail: bytes) -> bytes:  # unframed: one event's bytes
        return head + body + tail

    def raw(self, data: bytes) -> None:
        self.writes.append(data)


def _start_pump(
    stream: RequestStream,
    fmt: ChunkFormat,
    usage: Usage,
    cfg: StreamConfig,
    head: bytes,
    direct: FakeDirect | None = None,
) -> tuple[asyncio.Task[bool], list[bytes]]:
    """`pump_sse` as a task whose (never blocking) writes are collected in the returned list."""
    pumped: list[bytes] = []

    async def write(data: bytes) -> None:
        pumped.append(data)

    return asyncio.create_task(pump_sse(stream, fmt, usage, write, cfg, head, direct)), pumped


def test_direct_path_writes_without_waking_the_pump_and_the_end_goes_through_it() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes]]:
        stream = RequestStream("r", 1)
        direct = FakeDirect()
        fmt = ChunkFormat(True, "chatcmpl-x", 0, "m", 1, True, TokenTexts(FakeTokenizer()))
        task, pumped = _start_pump(stream, fmt, Usage([3], 1), StreamConfig(), fmt.role(), direct)
        await settle()
        waiter = stream._waiter  # the pump is parked on this future
        for ch in "abc":
            _push(stream, delta(ch))  # one routing pass each: one direct write each
        stream.push(delta("d"))
        stream.push(delta("e"))
        stream.deliver()  # two tokens in one pass: one write, first-token rule already spent
        await settle()
        assert stream.pending == [] and len(pumped) == 1  # only the role chunk went through the pump
        assert waiter is not None and stream._waiter is waiter and not waiter.done()
        direct.free = False  # the client stops reading: the pump takes over and coalesces
        _push(stream, delta("f"))
        _push(stream, delta("g"))
        await settle()
        direct.free = True
        _push(stream, delta("h", finish=FinishReason.LENGTH))  # the end: always the pump
        await asyncio.wait_for(task, 5)
        assert stream.flusher is None
        return direct.writes, pumped

    direct_writes, pumped = asyncio.run(scenario())
    assert _contents(direct_writes) == [["a"], ["b"], ["c"], ["de"]]
    events = sse_events(b"".join(pumped))
    contents = [e["choices"][0]["delta"].get("content") for e in events if e != "[DONE]" and e["choices"]]
    assert "".join(c for c in contents if c) == "fgh"
    assert events[-2]["usage"]["completion_tokens"] == 0 or events[-2]["choices"] == []
    assert events[-1] == "[DONE]"


def test_direct_path_is_off_with_a_gathering_delay_and_for_failures() -> None:
    async def scenario() -> tuple[list[bytes], list[bytes]]:
        stream = RequestStream("r", 2)
        direct = FakeDirect()
        task, pumped = _start_pump(stream, _fmt(2), Usage([3], 2), StreamConfig(), b"", direct)
        await settle()
        _push(stream, delta("a", 0))
        _push(stream, delta("x", 1, FinishReason.STOP))  # one choice ends: still direct (n=2)
        _push(stream, delta("b", 0, FinishReason.ABORT))  # ABORT ends the request: the pump
        await asyncio.wait_for(task, 5)
        return direct.writes, pumped

    direct_writes, pumped = asyncio.run(scenario())
    assert _contents(direct_writes) == [["a"], ["x"]]
    assert b'"finish_reason":"stop"' in direct_writes[1]
    assert b'"error"' in b"".join(pumped) and pumped[-1].endswith(b"data: [DONE]\n\n")

    async def delayed() -> bool:
        stream = RequestStream("r", 1)
        cfg = StreamConfig(max_delay_ms=5)
        task, _ = _start_pump(stream, _fmt(), Usage([3], 1), cfg, b"", FakeDirect())
        await settle()
        installed = stream.flusher is not None
        _push(stream, delta("a", 0, FinishReason.STOP))
        await asyncio.wait_for(task, 5)
        return installed

    assert asyncio.run(delayed()) is False
