"""Coalescing: first token alone, at most N tokens per event, merging under a busy socket, order kept."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from fake_engine import FakeTokenizer
from http_helpers import sse_events
from rillet.core.config import StreamConfig
from rillet.core.outputs import SeqDelta
from rillet.core.sequence import FinishReason
from rillet.http.openai.chunks import ChunkFormat, Usage
from rillet.http.openai.logprobs import TokenTexts
from rillet.http.stream import sse
from rillet.http.stream.coalesce import coalesce
from rillet.http.stream.request_stream import RequestStream
from rillet.http.stream.sse import pump_sse


def delta(text: str, index: int = 0, finish: FinishReason | None = None, ntok: int | None = None) -> SeqDelta:
    ids = list(range(ntok if ntok is not None else len(text)))
    return SeqDelta("r", index, ids, text, None, finish, 3, 0, 0)


async def settle() -> None:
    """Lets the pump run until it waits again (on the stream, the socket or its gathering wait).
    These scenarios have no I/O: each wake-up is a handful of ready callbacks, so a fixed number
    of loop turns (not a number of ms) is enough whatever the machine's speed or load."""
    for _ in range(20):
        await asyncio.sleep(0)


def _push(stream: RequestStream, d: SeqDelta) -> None:
    """What the dispatcher does for one delta in a routing pass of its own."""
    stream.push(d)
    stream.deliver()


def test_first_token_of_each_choice_is_alone() -> None:
    started = [False, False]
    pieces = coalesce([delta("a"), delta("b"), delta("c"), delta("x", 1), delta("y", 1)], 16, started)
    assert [(p.index, p.text) for p in pieces] == [(0, "a"), (0, "bc"), (1, "x"), (1, "y")]
    assert started == [True, True]
    # Later rounds: no first-token split any more.
    assert [p.text for p in coalesce([delta("d"), delta("e")], 16, started)] == ["de"]


def test_at_most_n_tokens_per_event_and_order_kept() -> None:
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"  # 40 one-token deltas
    pieces = coalesce([delta(ch) for ch in letters], 16, [True])
    assert [p.num_tokens for p in pieces] == [16, 16, 8]
    assert "".join(p.text for p in pieces) == letters
    # One delta larger than the limit cannot be split per token: it stays one event.
    big = coalesce([delta("xy"), delta("0123456789", ntok=10), delta("z")], 4, [True])
    assert [p.text for p in big] == ["xy", "0123456789", "z"]


def test_interleaved_choices_keep_their_own_order_and_finish() -> None:
    ds = [
        delta("a", 0),
        delta("1", 1),
        delta("b", 0),
        delta("2", 1),
        delta("c", 0, FinishReason.STOP),
        delta("3", 1),
    ]
    pieces = coalesce(ds, 16, [True, True])
    assert [(p.index, p.text, p.finish) for p in pieces] == [
        (0, "abc", FinishReason.STOP),
        (1, "123", None),
    ]


def _fmt(n: int = 1) -> ChunkFormat:
    return ChunkFormat(True, "chatcmpl-x", 0, "m", n, False, TokenTexts(FakeTokenizer()))


def _contents(writes: list[bytes]) -> list[list[str]]:
    """Per write: the content of each content event in it."""
    out = []
    for w in writes:
        events = [e for e in sse_events(w) if e != "[DONE]"]
        out.append(
            [e["choices"][0]["delta"]["content"] for e in events if "content" in e["choices"][0]["delta"]]
        )
    return out


def test_tokens_piling_up_behind_a_busy_socket_merge_into_one_write() -> None:
    async def scenario() -> list[bytes]:
        stream = RequestStream("r", 1)
        writes: list[bytes] = []
        socket_free = asyncio.Event()
        socket_free.set()

        async def write(data: bytes) -> None:
            writes.append(data)
            await socket_free.wait()

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
