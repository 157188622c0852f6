"""Fault isolation: a fault in one request fails that request only; a dead engine is reported, never
waited on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest
from engine_hooks import fail_postprocessing, hold_first_step, hold_steps
from rel_helpers import (
    CHAT,
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
    serving,
    stream_text,
    wait_for,
)
from rillet.http.background import BackgroundServer

TOKENS = 100


async def _stream(port: int, path: str, body: dict[str, Any]) -> list[Any]:
    raw = await send(port, path, {**body, "stream": True})
    await raw.read_head()
    assert raw.status == 200
    events = [e async for _, e in raw.events()]
    raw.close()
    return events


def test_injected_fault_fails_only_its_request() -> None:
    with served("model.synthetic_step_ms=5") as (engine, srv):
        model = engine.model_name
        chat = {"model": model, "max_tokens": TOKENS, "ignore_eos": True}
        comp = {"model": model, "max_tokens": TOKENS, "ignore_eos": True}
        victims: list[str] = []

        def inject(batch: Any) -> bool:
            # On the engine thread, before a step: once all 8 chat streams + 4 completions are
            # running and each has a few tokens, fail one of each kind, mid-generation. The first
            # step is held until all 12 are in, so none can have ended before (each needs 100).
            ids = list(engine.core.seqs)
            if not victims and len(ids) == 12 and all(len(s.output_ids) >= 3 for s in batch.seqs):
                victims.extend(
                    [
                        next(i for i in ids if i.startswith("chatcmpl-")),
                        next(i for i in ids if i.startswith("cmpl-")),
                    ]
                )
                fail_postprocessing(engine, victims)
            return True

        async def run() -> tuple[list[list[Any]], list[tuple[int, bytes]]]:
            streams = [
                _stream(srv.port, CHAT, {**chat, "messages": [{"role": "user", "content": f"s{i}"}]})
                for i in range(8)
            ]
            plain = [fetch(srv.port, COMP, {**comp, "prompt": f"p{i}"}) for i in range(4)]
            results = await asyncio.gather(asyncio.gather(*streams), asyncio.gather(*plain))
            return results[0], results[1]

        hold_first_step(engine, 12)
        with hold_steps(engine, until=inject):
            streams, plain = asyncio.run(run())
        assert len(victims) == 2
        failed_streams = [s for s in streams if s[-2].get("error")]
        assert len(failed_streams) == 1
        bad = failed_streams[0]
        assert bad[-1] == "[DONE]" and bad[-2]["error"]["code"] == "generation_error"
        assert "injected fault" in bad[-2]["error"]["message"] and bad[0]["id"] == victims[0]
        for s in streams:
            if s is not bad:
                assert s[-1] == "[DONE]" and len(stream_text(s)[0]) > 0
                assert s[-2]["choices"][0]["finish_reason"] == "length"
        statuses = sorted(status for status, _ in plain)
        assert statuses == [200, 200, 200, 500], statuses
        for status, data in plain:
            body = orjson.loads(data)
            if status == 500:
                assert is_openai_error(body) and body["error"]["code"] == "generation_error"
            else:
                assert body["usage"]["completion_tokens"] == TOKENS
        assert engine.healthy
        assert_all_released(engine, srv)
        assert_serves(srv, model)


def test_request_that_cannot_be_added_fails_alone() -> None:
    with served("model.synthetic_step_ms=5") as (engine, srv):
        model = engine.model_name
        poison = [4242, 4243, 4244]
        make = engine.core.make_detokenizer

        def flaky(seq: Any) -> Any:
            if seq.prompt_ids == poison:
                raise ValueError("detokenizer could not be built")
            return make(seq)

        engine.core.make_detokenizer = flaky
        body = {"model": model, "max_tokens": TOKENS, "ignore_eos": True}

        async def run() -> tuple[list[Any], tuple[int, bytes]]:
            ok = asyncio.create_task(_stream(srv.port, COMP, {**body, "prompt": "fine"}))
            await asyncio.sleep(0.05)
            bad = await fetch(srv.port, COMP, {**body, "prompt": poison})
            return await ok, bad

        ok, (status, data) = asyncio.run(run())
        assert status == 500 and orjson.loads(data)["error"]["code"] == "generation_error"
        assert "detokenizer could not be built" in orjson.loads(data)["error"]["message"]
        assert ok[-1] == "[DONE]" and ok[-2]["choices"][0]["finish_reason"] == "length"
        assert engine.healthy
        assert_all_released(engine, srv)
        assert_serves(srv, model)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_engine_death_is_reported_to_everyone_waiting_and_to_health() -> None:
    cfg = ("model.synthetic_step_ms=5", "scheduler.max_num_seqs=1")
    with engine_with(*cfg) as engine, serving(engine, *cfg) as srv:
        model = engine.model_name
        results: dict[str, Any] = {}
        long = {"model": model, "prompt": "doomed", "max_tokens": 200, "ignore_eos": True}

        def stream() -> None:
            results["stream"] = asyncio.run(_stream(srv.port, COMP, long))

        def queued() -> None:
            results["queued"] = post(srv, COMP, {**long, "prompt": "waiting"})

        threads = [threading.Thread(target=stream), threading.Thread(target=queued)]
        threads[0].start()
        wait_for(lambda: engine.stats().running == 1, what="stream running")
        threads[1].start()
        wait_for(lambda: engine.stats().waiting == 1, what="second request queued")

        def crash(*_: object) -> None:
            raise RuntimeError("simulated engine crash")

        engine.core.step = crash  # the engine thread's next step raises: the thread dies
        for t in threads:
            t.join(10)
        events = results["stream"]
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "dead", events[-2:]
        assert results["queued"].status_code == 503
        assert results["queued"].json()["error"]["code"] == "dead"
        wait_for(lambda: srv.state.phase == "dead", what="server marked dead")
        assert srv.state.died.is_set() and not engine.healthy
        health = request(srv, "GET", "/health")
        assert health.status_code == 503 and "simulated engine crash" in health.json()["error"]
        late = post(srv, CHAT, {"model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert late.status_code == 503 and late.json()["error"]["code"] == "dead"
        _assert_no_open_requests(srv)


def _assert_no_open_requests(srv: BackgroundServer) -> None:
    wait_for(lambda: srv.state.inflight == 0, 10, "handlers finished")
    assert srv.state.dispatcher is not None and srv.state.dispatcher.active == 0
