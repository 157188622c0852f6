"""Helpers shared by the HTTP tests (imported by name: tests/support is on pytest's pythonpath)."""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from rillet.core.config import RilletConfig, load_config
from rillet.http.background import BackgroundServer

# Synthetic engine: real scheduler, KV pool, detokenizer and stop handling; no model compute.
# Asynchronous (a GPU-like device timeline), so the HTTP tests run over overlapped engine steps
# (engine.overlap auto): a stopped choice's extra token must never reach a client.
SYNTH_OVERRIDES = [
    "model.kind=synthetic",
    "model.synthetic_step_ms=1",
    "model.synthetic_async=true",
    "model.max_model_len=256",
    "cache.num_blocks=1024",
    "scheduler.max_num_seqs=64",
]


@contextmanager
def serving(engine: Any, *overrides: str, cfg: RilletConfig | None = None) -> Iterator[BackgroundServer]:
    """A server on 127.0.0.1:<free port> over `engine` (None: never gets one, stays 'starting')."""
    cfg = cfg or load_config(None, list(overrides))
    srv = BackgroundServer(cfg).start(engine)
    try:
        yield srv
    finally:
        srv.stop()


@contextmanager
def sdk_clients(overrides: list[str]) -> Iterator[tuple[Any, Any]]:
    """A real engine built from `overrides`, served on 127.0.0.1, and the official `openai` and
    `anthropic` clients pointed at it (no retries: a failure shows as it is)."""
    import anthropic
    import openai
    from rillet.core.engine.engine import Engine

    cfg = load_config(None, overrides)
    engine = Engine(cfg)
    engine.start()
    try:
        with serving(engine, cfg=cfg) as srv:
            yield (
                openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=60),
                anthropic.Anthropic(base_url=srv.root_url, api_key="x", max_retries=0, timeout=60),
            )
    finally:
        engine.shutdown()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


async def until(cond: Callable[[], bool], what: str = "condition", timeout: float = 30.0) -> None:
    """On the event loop: yields to the loop's other tasks until `cond()` holds (the timeout only
    bounds a hang). A test waits for the state it needs, never for a guessed number of ms."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def sse_events(body: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body: parsed JSON, or the string "[DONE]"."""
    out: list[Any] = []
    for block in body.split(b"\n\n"):
        if not block.strip():
            continue
        assert block.startswith(b"data: "), block
        data = block[len(b"data: ") :]
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


@dataclass
class Resp:
    status_code: int
    headers: dict[str, str]  # lower-cased names
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode()

    def json(self) -> Any:
        return orjson.loads(self.content)


def request(
    srv: BackgroundServer, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> Resp:
    """One raw HTTP exchange (stdlib client: no retries, no validation of our answers)."""
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
    try:
        content = body if body is None or isinstance(body, bytes) else orjson.dumps(body)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=content, headers=hdrs)
        r = conn.getresponse()
        return Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def post(srv: BackgroundServer, path: str, body: Any, headers: dict[str, str] | None = None) -> Resp:
    return request(srv, "POST", path, body, headers)


def assert_error(resp: Resp, status: int, param: str | None = None, code: str | None = None) -> None:
    """Exact status and the OpenAI error shape."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
