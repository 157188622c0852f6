"""Admission control: a full waiting queue is a 429 the client recovers from; deadlines; oversize
prompts are refused up front, before the engine sees them."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import orjson
from engine_hooks import hold_steps, scheduled_batches
from rel_helpers import (
    COMP,
    assert_all_released,
    assert_serves,
    engine_with,
    fetch,
    is_openai_error,
    post,
    request,
    send,
    served,
    wait_for,
)
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason

CLIENTS = 16
ROOM = 2 + 4  # running + waiting


def test_queue_full_is_429_with_retry_after_then_recovers() -> None:
    config = ("model.synthetic_step_ms=5", "scheduler.max_num_seqs=2", "scheduler.max_waiting=4")
    with served(*config) as (engine, srv):
        body = {"model": engine.model_name, "prompt": "queue", "max_tokens": 20, "ignore_eos": True}
        statuses: Counter[int] = Counter()
        # The first model step is held until every client beyond the engine's room has had its
        # 429: the queue really is full whatever this machine's speed (nothing finishes meanwhile).
        hold = hold_steps(engine, until=lambda batch: statuses[429] >= CLIENTS - ROOM)

        async def client(i: int) -> int:
            for _ in range(60):  # bounded retries
                raw = await send(srv.port, COMP, {**body, "prompt": f"queue {i}"})
                try:
                    await raw.read_head()
                    data = await raw.body()
                finally:
                    raw.close()
                statuses[raw.status] += 1
                if raw.status == 200:
                    return int(orjson.loads(data)["usage"]["completion_tokens"])
                assert raw.status == 429, data
                err = orjson.loads(data)
                assert is_openai_error(err) and err["error"]["code"] == "queue_full", err
                assert err["error"]["type"] == "rate_limit_error"
                await asyncio.sleep(float(raw.headers["retry-after"]))  # as a polite client does
            raise AssertionError("never admitted")

        async def run() -> list[int]:
            return await asyncio.gather(*(client(i) for i in range(CLIENTS)))

        with hold:
            done = asyncio.run(run())
        print(f"queue full: statuses over all attempts {dict(statuses)}")
        assert done == [20] * CLIENTS  # every client got through in the end
        assert statuses[429] >= CLIENTS - ROOM, statuses  # 16 at once into 2 running + 4 waiting
        metrics = request(srv, "GET", "/metrics").text
        assert 'rillet_requests_total{endpoint="/v1/completions",status="429"}' in metrics
        assert_all_released(engine, srv)


def test_queued_request_expires_at_its_deadline_without_running() -> None:
    with engine_with("model.synthetic_step_ms=10", "scheduler.max_num_seqs=1") as engine:
        ids = engine.tokenizer.encode("deadline")
        engine.add_request("hog", ids, SamplingParams(max_tokens=200, ignore_eos=True))
        wait_for(lambda: engine.stats().running == 1, what="hog running")
        added = time.monotonic()
        engine.add_request("late", ids, SamplingParams(max_tokens=5), deadline=added + 0.1)
        seen: list[Any] = []
        while not any(d.request_id == "late" for d in seen) and time.monotonic() - added < 30:
            for out in engine.ring.pop_all():
                seen.extend(out.deltas)
            time.sleep(0.01)
        late = [d for d in seen if d.request_id == "late"]
        assert len(late) == 1 and late[0].finish_reason is FinishReason.ERROR
        assert late[0].error == "request deadline exceeded" and late[0].completion_tokens == 0
        assert time.monotonic() - added >= 0.1  # not before its deadline
        # At its deadline, not when its turn came: the hog (200 steps of >= 10 ms) was still
        # running when the expiry was published, whatever this machine's speed.
        before = seen[: next(i for i, d in enumerate(seen) if d.request_id == "late")]
        assert not any(d.request_id == "hog" and d.finish_reason is not None for d in before)
        engine.abort("hog")
        assert engine.wait_idle(5)
        engine.core.blocks.check_integrity()
        assert engine.stats().kv_blocks_used == 0


def test_deadline_is_504_or_an_sse_error_event() -> None:
    # A long request needs 200 steps of >= 10 ms: it cannot end within the 1 s deadline on any
    # machine; the short one (5 steps) has 20 times what it needs.
    with served("model.synthetic_step_ms=10", "server.request_timeout_s=1.0") as (engine, srv):
        long = {"model": engine.model_name, "prompt": "slow", "max_tokens": 200, "ignore_eos": True}
        t0 = time.monotonic()
        resp = post(srv, COMP, long)
        assert resp.status_code == 504 and time.monotonic() - t0 >= 1.0
        assert is_openai_error(resp.json()) and resp.json()["error"]["code"] == "deadline_exceeded"

        async def stream() -> list[Any]:
            raw = await send(srv.port, COMP, {**long, "stream": True})
            await raw.read_head()
            events = [e async for _, e in raw.events()]
            raw.close()
            return events

        events = asyncio.run(stream())
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "deadline_exceeded"
        assert any(e.get("choices") and e["choices"][0]["text"] for e in events[:-2])
        short = post(srv, COMP, {**long, "max_tokens": 5})  # well inside the deadline
        assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 5
        assert_all_released(engine, srv)


def test_oversize_prompts_are_refused_before_the_engine() -> None:
    with served("model.synthetic_step_ms=0", "scheduler.max_waiting=4") as (engine, srv):
        model = engine.model_name
        assert engine.wait_idle(5)
        steps = engine.stats().steps
        cases = [
            ({"prompt": list(range(1, 300)), "max_tokens": 1}, "prompt", "context_length_exceeded"),
            ({"prompt": list(range(1, 200)), "max_tokens": 100}, "max_tokens", "context_length_exceeded"),
            ({"prompt": ["a"] * 5, "max_tokens": 1}, "prompt", None),  # more prompts than the queue
        ]
        for extra, param, code in cases:
            status, data = asyncio.run(fetch(srv.port, COMP, {"model": model, **extra}))
            err = orjson.loads(data)
            assert status == 400 and is_openai_error(err), data
            assert err["error"]["param"] == param and (code is None or err["error"]["code"] == code)
        assert engine.stats().steps == steps  # none of them reached the engine
        assert_serves(srv, model)


def test_a_multi_prompt_completion_starts_in_one_step() -> None:
    """The prompts of one /v1/completions request go to the engine as one inbox item
    (Engine.add_requests): the first step that schedules any of them schedules all."""
    with served("model.synthetic_step_ms=2") as (engine, srv):
        with scheduled_batches(engine) as batches:
            for i in range(5):
                prompts = [f"p{i} {k}" for k in range(4)]
                body = {"model": engine.model_name, "prompt": prompts, "max_tokens": 3}
                resp = post(srv, COMP, body)
                assert resp.status_code == 200 and len(resp.json()["choices"]) == 4, resp.text
            assert engine.wait_idle(5)
        assert len({rid for b in batches for rid in b}) == 20
        started: set[str] = set()
        for b in batches:  # a step that brings in new requests brings in a whole completion's four
            assert len(b - started) % 4 == 0, batches
            started |= b
        assert_all_released(engine, srv)
