"""Back-pressure: a client that reads slowly or not at all costs the others nothing, and the server
holds at most `stream.max_buffered_tokens` of its output before cutting it off (logged)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import pytest
from http_helpers import until
from rel_helpers import (
    COMP,
    RawResponse,
    assert_all_released,
    assert_serves,
    send,
    served,
    stream_text,
    wait_for,
)
from rillet.http import generate
from rillet.http.background import BackgroundServer
from rillet.http.stream import sse
from rillet.http.stream.request_stream import RequestStream

# Handoff on (with a timeout no machine reaches): the engine runs a step only once the loop has
# routed the previous one, so what piles up before the cut is bounded by the socket's and the
# transport's buffers in bytes, not by how far the engine ran ahead of a busy loop.
CUT = (
    "model.synthetic_step_ms=1",
    "model.max_model_len=8192",
    "stream.max_buffered_tokens=64",
    "stream.handoff=on",
    "stream.handoff_timeout_ms=60000",
)
HUGE = {"prompt": "never read", "max_tokens": 6000, "ignore_eos": True, "stream": True}


async def _stalled(srv: BackgroundServer, model: str) -> RawResponse:
    """A stream whose client takes the head and then reads nothing (tiny receive buffers)."""
    raw = await send(srv.port, COMP, {**HUGE, "model": model}, rcvbuf=4096, limit=4096)
    await raw.read_head()
    assert raw.status == 200
    return raw


def _cut_logged(caplog: pytest.LogCaptureFixture) -> bool:
    return any("cut off" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.parametrize("order", ["as_formatted", "after_release"])
def test_stalled_reader_is_cut_off_and_disconnected(
    order: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`order`: stream.write_order, whether a pass's writes go out before the engine's release."""
    caplog.set_level(logging.WARNING, logger="rillet.http.stream.dispatcher")
    monkeypatch.setattr(generate, "CUT_OFF_GRACE_S", 0.5)  # the grace ends while nothing is read
    with served(*CUT, f"stream.write_order={order}") as (engine, srv):
        assert srv.state.dispatcher is not None
        assert srv.state.dispatcher.write_last is (order == "after_release")

        async def run() -> bytes:
            raw = await _stalled(srv, engine.model_name)
            await asyncio.to_thread(wait_for, lambda: _cut_logged(caplog), 30, "cut-off logged")
            # It still reads nothing: after the grace period the server drops the connection.
            await asyncio.to_thread(wait_for, lambda: srv.state.inflight == 0, 10, "handler gone")
            got = b""
            try:
                while chunk := await asyncio.wait_for(raw.reader.read(1 << 16), 5):
                    got += chunk
            except ConnectionResetError:
                pass
            raw.close()
            return got

        got = asyncio.run(run())
        assert b"[DONE]" not in got  # cut, not finished
        # Aborted in the engine long before its 6,000 tokens: only what the socket absorbed + 64.
        generated = engine.stats().generated_tokens
        print(f"stalled reader: {generated} tokens generated before the cut")
        assert generated < 3000
        assert_all_released(engine, srv)
        assert_serves(srv, engine.model_name)


def test_slow_reader_that_catches_up_gets_the_error_event(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="rillet.http.stream.dispatcher")
    monkeypatch.setattr(generate, "CUT_OFF_GRACE_S", 60.0)  # it starts reading within any grace
    with served(*CUT) as (engine, srv):

        async def run() -> list[Any]:
            raw = await _stalled(srv, engine.model_name)
            await asyncio.to_thread(wait_for, lambda: _cut_logged(caplog), 30, "cut-off logged")
            events = [e async for _, e in raw.events()]  # now it reads, within the grace
            raw.close()
            return events

        events = asyncio.run(run())
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == "stream_buffer_full", events[-2]
        texts = [e["choices"][0]["text"] for e in events[:-2]]
        assert len(texts) > 100 and all(texts)  # what it read before the cut was intact
        assert_all_released(engine, srv)


# ---- what a stuck reader costs the others ---------------------------------------------------------

SLOW = (
    "model.synthetic_step_ms=10",
    "model.max_model_len=1024",
    "scheduler.max_num_seqs=128",
    "stream.max_buffered_tokens=100000",  # the stuck readers stay (stuck) for the whole test
)
NORMAL = 8
EXTRA = 4  # streams of 8 choices each whose clients read nothing
BACKLOG = 200  # tokens piled up behind each stuck socket before the others start
# The extras ask for 1,000 tokens: they run for the whole test even if a busy loop coalesced
# several steps per event (more tokens per buffered byte) before their sockets filled up.


async def _normal(port: int, model: str, i: int) -> list[Any]:
    body = {
        "model": model,
        "prompt": f"normal {i}",
        "max_tokens": 100,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw = await send(port, COMP, body)
    await raw.read_head()
    events = [e async for _, e in raw.events()]
    raw.close()
    return events


def test_stuck_readers_cost_the_others_no_work_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism that keeps the others' inter-token latency (bench/serving/slow_readers.py measures
    it): while a client's socket is full, its tokens are only appended to its stream: no
    formatting, no write, no wake-up per token; the engine never waits; everyone else gets every
    token. Counted, not timed."""
    formatted: Counter[str] = Counter()  # engine request id -> formatting passes (direct or pump)
    coalesce = sse.coalesce

    def counting(deltas: list[Any], limit: int, started: list[bool]) -> Any:
        if deltas:
            formatted[deltas[0].request_id] += 1
        return coalesce(deltas, limit, started)

    single = sse.Emitter.single

    def counting_single(self: sse.Emitter, d: Any, direct: Any) -> Any:  # the one-token fast path
        formatted[d.request_id] += 1
        return single(self, d, direct)

    monkeypatch.setattr(sse, "coalesce", counting)
    monkeypatch.setattr(sse.Emitter, "single", counting_single)
    with served(*SLOW) as (engine, srv):
        model = engine.model_name
        disp = srv.state.dispatcher
        assert disp is not None

        def extras() -> list[RequestStream]:
            return [st for st, _ in disp._routes.values() if st.num_choices == 8]

        async def run() -> tuple[list[list[Any]], dict[str, int], list[int]]:
            body = {"model": model, "max_tokens": 1000, "n": 8, "ignore_eos": True, "stream": True}
            stuck = [
                await send(srv.port, COMP, {**body, "prompt": f"extra {i}"}, rcvbuf=4096, limit=4096)
                for i in range(EXTRA)
            ]
            await until(
                lambda: len(extras()) == EXTRA and min(st.pending_tokens for st in extras()) > BACKLOG,
                f"{BACKLOG} tokens piled up behind every stuck socket",
                timeout=120,
            )
            ids = [eid for st in extras() for eid in st.engine_ids]
            before = {eid: formatted[eid] for eid in ids}
            total0 = sum(formatted.values())
            backlog0 = [st.pending_tokens for st in extras()]
            normal = await asyncio.gather(*(_normal(srv.port, model, i) for i in range(NORMAL)))
            grown = [st.pending_tokens - b for st, b in zip(extras(), backlog0, strict=True)]
            after = {eid: formatted[eid] - before[eid] for eid in ids}
            assert sum(formatted.values()) - total0 >= NORMAL * 2  # the counter sees the others' work
            for raw in stuck:
                raw.close()
            return normal, after, grown

        full_waits0 = engine.ring.full_waits
        normal, stuck_formatting, grown = asyncio.run(run())
        for events in normal:
            assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1])
            assert events[-3]["choices"][0]["finish_reason"] == "length" and stream_text(events)[0]
            assert events[-2]["usage"]["completion_tokens"] == 100  # every token came through
        # The stuck streams kept receiving tokens (100 steps x 8 choices) and cost no formatting.
        assert min(grown) >= 100 * 8, grown
        assert set(stuck_formatting.values()) == {0}, stuck_formatting
        assert engine.ring.full_waits == full_waits0  # the engine never waited for the loop
        assert_all_released(engine, srv)
        assert_serves(srv, model)
