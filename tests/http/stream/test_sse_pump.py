"""pump_sse's writes: tokens piling up behind a busy socket merge into one write (at most N per
event, order kept), a gathering delay holds later tokens but never the first nor the end, the
usage chunk and logprobs events, and the end of a stream in one call of `end` (not on failure)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from fake_engine import FakeTokenizer
from http_doubles.stream_deltas import chat_format as _fmt
from http_doubles.stream_deltas import contents as _contents
from http_doubles.stream_deltas import delta, settle
from http_doubles.stream_deltas import push as _push
from http_helpers import sse_events
from rillet.core.config import StreamConfig
from rillet.core.outputs import SeqDelta
from rillet.core.sequence import FinishReason
from rillet.http.openai.chunks import ChunkFormat, Usage
from rillet.http.openai.logprobs import TokenTexts
from rillet.http.stream import sse
from rillet.http.stream.request_stream import RequestStream
from rillet.http.stream.sse import pump_sse


def _socket() -> tuple[list[bytes], asyncio.Event, Callable[[bytes], Awaitable[None]]]:
    """A socket's write: records what is written, then blocks while `free` is clear (a client that
    stopped reading)."""
    writes: list[bytes] = []
    free = asyncio.Event()
    free.set()

    async def write(data: bytes) -> None:
        writes.append(data)
        await free.wait()

    return writes, free, write


def test_tokens_piling_up_behind_a_busy_socket_merge_into_one_write() -> None:
    async def scenario() -> list[bytes]:
        stream = RequestStream("r", 1)
        writes, socket_free, write = _socket()

        cfg = StreamConfig(max_tokens_per_event=4)
        fmt = _fmt()
        task = asyncio.create_task(pump_sse(stream, fmt, Usage([3], 1), write, cfg, fmt.role()))
        await settle()
        _push(stream, delta("a"))  # the first token goes out at once
        await settle()
        socket_free.clear()  # the client stops reading
        _push(stream, delta("b"))
        await settle()  # the writer is stuck writing "b"
        for ch in "cdefghij":
            _push(stream, delta(ch))
        await settle()
        assert len(writes) == 3  # role, "a", "b": nothing more while the socket is busy
        socket_free.set()
        await settle()
        _push(stream, delta("k", finish=FinishReason.LENGTH))
        await asyncio.wait_for(task, 5)
        return writes

    writes = asyncio.run(scenario())
    contents = _contents(writes)
    assert contents[:3] == [[""], ["a"], ["b"]]
    assert contents[3] == ["cdef", "ghij"]  # 8 tokens that piled up: one write, 4 per event
    assert "".join(c for w in contents for c in w) == "abcdefghijk"
    assert sse_events(writes[-1])[-1] == "[DONE]"


def test_max_delay_gathers_later_tokens_but_never_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pump's gathering wait is its only `asyncio.sleep`: it is replaced by one that records the
    # delay asked for and ends when the test says, so "within the window" is a fact of the test,
    # not a race between 20 ms of the test's sleep and 80 ms of the pump's on a busy machine.
    gathering: list[float] = []
    window_over = asyncio.Event()

    async def gathering_wait(delay: float) -> None:
        gathering.append(delay)
        await window_over.wait()
        window_over.clear()

    monkeypatch.setattr(sse, "asyncio", SimpleNamespace(sleep=gathering_wait))

    async def scenario() -> list[bytes]:
        stream = RequestStream("r", 1)
        writes: list[bytes] = []

        async def write(data: bytes) -> None:
            writes.append(data)

        cfg = StreamConfig(max_tokens_per_event=16, max_delay_ms=80)
        task = asyncio.create_task(pump_sse(stream, _fmt(), Usage([3], 1), write, cfg, b""))
        await settle()
        _push(stream, delta("a"))
        await settle()
        assert len(writes) == 1 and gathering == []  # first token: written with no gathering wait
        _push(stream, delta("b"))
        await settle()
        assert len(writes) == 1 and gathering == [0.08]  # "b" waits out the 80 ms window...
        _push(stream, delta("c"))  # ...and "c", arriving within it, joins it
        await settle()
        assert len(writes) == 1
        window_over.set()
        await settle()
        assert len(writes) == 2
        _push(stream, delta("d", finish=FinishReason.STOP))  # the end is never held back
        await asyncio.wait_for(task, 5)
        assert gathering == [0.08]
        return writes

    writes = asyncio.run(scenario())
    assert _contents(writes)[:3] == [["a"], ["bc"], ["d"]]


def test_usage_chunk_and_logprobs_events() -> None:
    async def scenario() -> bytes:
        stream = RequestStream("r", 1)
        out: list[bytes] = []

        async def write(data: bytes) -> None:
            out.append(data)

        fmt = ChunkFormat(False, "cmpl-x", 0, "m", 1, True, TokenTexts(FakeTokenizer()))
        task = asyncio.create_task(pump_sse(stream, fmt, Usage([3], 1), write, StreamConfig(), b""))
        from rillet.core.sequence import TokenLogprob

        lp = [TokenLogprob(104, -0.5, [(104, -0.5), (105, -1.0)])]
        _push(stream, SeqDelta("r", 0, [104], "h", lp, None, 3, 1, 1))
        _push(stream, SeqDelta("r", 0, [105], "i", None, FinishReason.LENGTH, 3, 1, 2))
        await asyncio.wait_for(task, 5)
        return b"".join(out)

    events: list[Any] = sse_events(asyncio.run(scenario()))
    assert events[0]["choices"][0]["logprobs"] == {
        "tokens": ["h"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{"h": -0.5, "i": -1.0}],
        "text_offset": [0],
    }
    assert all(e["usage"] is None for e in events[:-2])
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 2
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    assert events[-1] == "[DONE]"


def test_the_end_of_a_stream_is_one_call_of_end_and_a_failure_is_not() -> None:
    """The server passes aiohttp's write_eof as `end`: the last tokens, the usage chunk and [DONE]
    then leave with the chunked body's terminator in one send."""

    async def scenario(last: FinishReason) -> tuple[list[bytes], list[bytes]]:
        stream = RequestStream("r", 1)
        pumped: list[bytes] = []
        ended: list[bytes] = []

        async def write(data: bytes) -> None:
            pumped.append(data)

        async def end(data: bytes) -> None:
            ended.append(data)

        fmt = ChunkFormat(True, "chatcmpl-x", 0, "m", 1, True, TokenTexts(FakeTokenizer()))
        pump = pump_sse(stream, fmt, Usage([3], 1), write, StreamConfig(), fmt.role(), end=end)
        task = asyncio.create_task(pump)
        await settle()
        _push(stream, delta("a"))
        await settle()
        _push(stream, delta("b", finish=last))
        await asyncio.wait_for(task, 5)
        return pumped, ended

    pumped, ended = asyncio.run(scenario(FinishReason.LENGTH))
    assert len(ended) == 1 and ended[0].endswith(b"data: [DONE]\n\n")
    assert b'"content":"b"' in ended[0] and b'"usage"' in ended[0]
    assert not any(b"[DONE]" in p for p in pumped)
    pumped, ended = asyncio.run(scenario(FinishReason.ERROR))
    assert ended == [] and b'"error"' in pumped[-1]  # the caller's write_eof closes the body after it


def test_tokens_piled_up_before_a_failure_still_go_out_ahead_of_its_error_event() -> None:
    """A deadline (or any ERROR end) reaching a slow reader's pile: the tokens generated before it
    were the client's as much as the ones already sent; only what the failure ends is cut."""

    async def scenario() -> list[bytes]:
        stream = RequestStream("r", 1)
        writes, socket_free, write = _socket()

        fmt = _fmt()
        task = asyncio.create_task(pump_sse(stream, fmt, Usage([3], 1), write, StreamConfig(), fmt.role()))
        await settle()
        _push(stream, delta("a"))
        await settle()
        socket_free.clear()  # the client stops reading
        _push(stream, delta("b"))
        await settle()  # the writer is stuck writing "b"
        for ch in "cde":
            _push(stream, delta(ch))
        _push(stream, delta("", finish=FinishReason.ERROR))
        socket_free.set()
        await asyncio.wait_for(task, 5)
        return writes

    writes = asyncio.run(scenario())
    events = [e for w in writes for e in sse_events(w) if e != "[DONE]"]
    texts = [e["choices"][0]["delta"].get("content", "") for e in events if "choices" in e]
    assert "".join(texts) == "abcde" and "error" in events[-1]
    assert b'"error"' in writes[-1] and sse_events(writes[-1])[-1] == "[DONE]"
