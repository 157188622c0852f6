"""Helpers of the reliability tests and of the long runs in tests/stress (imported by name).

A raw asyncio HTTP/1.1 client (so a test controls the socket: receive buffer size, when to stop
reading, FIN or RST), engines built from config overrides, and the end-of-test invariants: the KV
pool whole, no request left in the engine, the dispatcher or the handlers.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from http_helpers import post, request, serving, wait_for
from rillet.core.config import load_config
from rillet.http.background import BackgroundServer

__all__ = ["post", "request", "serving", "wait_for"]

# The synthetic engine: real scheduler, KV pool, detokenizer, stop handling; no model compute.
SYNTH = ["model.kind=synthetic", "model.max_model_len=256", "cache.num_blocks=1024"]
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


@contextmanager
def engine_with(*overrides: str) -> Iterator[Any]:
    """A started `Engine` on SYNTH plus `overrides`; shut down afterwards."""
    from rillet.core.engine.engine import Engine

    engine = Engine(load_config(None, [*SYNTH, *overrides]))
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()


@contextmanager
def served(*overrides: str) -> Iterator[tuple[Any, BackgroundServer]]:
    """An engine and a loopback server over it, both from the same overrides."""
    with engine_with(*overrides) as engine, serving(engine, *[*SYNTH, *overrides]) as srv:
        yield engine, srv


# ---- invariants ----------------------------------------------------------------------------------


def assert_all_released(engine: Any, srv: BackgroundServer | None = None, timeout: float = 20.0) -> None:
    """Nothing leaked: engine idle, every KV block back, no request held anywhere."""
    wait_for(lambda: engine.wait_idle(0.05), timeout, "engine idle")
    if srv is not None:
        disp = srv.state.dispatcher
        wait_for(lambda: srv.state.inflight == 0, timeout, "no handler in flight")
        assert disp is not None
        wait_for(lambda: disp.active == 0, timeout, "dispatcher routes empty")
    # The engine thread is parked (no work): reading its structures from here is safe.
    engine.core.blocks.check_integrity()
    stats = engine.stats()
    assert stats.kv_blocks_used == 0, stats
    assert stats.running == 0 and stats.waiting == 0, stats
    assert engine.core.seqs == {}, list(engine.core.seqs)
    sched = engine.core.scheduler
    assert not sched.running and not sched.waiting and not sched.waiting_embed


def assert_serves(srv: BackgroundServer, model: str) -> None:
    resp = post(srv, COMP, {"model": model, "prompt": "still there?", "max_tokens": 4, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 4


def is_openai_error(body: Any) -> bool:
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return False
    err = body["error"]
    return (
        set(err) == {"message", "type", "param", "code"}
        and isinstance(err["message"], str)
        and bool(err["message"])
        and isinstance(err["type"], str)
        and (err["param"] is None or isinstance(err["param"], str))
        and (err["code"] is None or isinstance(err["code"], str))
    )


# ---- a raw HTTP/1.1 client over asyncio streams ------------------------------------------------------


class RawResponse:
    """One request on its own connection; the test decides how much to read and how to leave."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.status = 0
        self.headers: dict[str, str] = {}

    async def read_head(self) -> None:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        for line in lines[1:]:
            if ":" in line:
                k, _, v = line.partition(":")
                self.headers[k.strip().lower()] = v.strip()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk (chunked encoding or Content-Length)."""
        if self.headers.get("transfer-encoding") == "chunked":
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    return
                data = await self.reader.readexactly(size + 2)
                yield data[:-2]
        else:
            yield await self.reader.readexactly(int(self.headers.get("content-length", "0")))

    async def body(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def events(self) -> AsyncIterator[tuple[float, Any]]:
        """SSE `data:` payloads as (arrival time, parsed JSON or "[DONE]")."""
        buf = b""
        async for chunk in self.chunks():
            now = time.perf_counter()
            buf += chunk
            *blocks, buf = buf.split(b"\n\n")
            for block in blocks:
                assert block.startswith(b"data: "), block
                data = block[6:]
                yield now, "[DONE]" if data == b"[DONE]" else orjson.loads(data)

    def close(self) -> None:
        """FIN: an orderly close."""
        self.writer.close()

    def reset(self) -> None:
        """RST: SO_LINGER 0 then close, as a crashed client or a dropped NAT entry looks."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.writer.transport.abort()


def request_bytes(method: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    hdrs = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(body))}
    hdrs.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    return head.encode() + body


async def connect(port: int, rcvbuf: int | None = None, limit: int = 2**16) -> RawResponse:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=limit)
    return RawResponse(reader, writer)


async def send(
    port: int, path: str, body: Any, *, rcvbuf: int | None = None, limit: int = 2**16
) -> RawResponse:
    """Opens a connection and sends one POST; the caller reads the answer (or does not)."""
    raw = await connect(port, rcvbuf, limit)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    raw.writer.write(request_bytes("POST", path, data))
    await raw.writer.drain()
    return raw


async def fetch(port: int, path: str, body: Any) -> tuple[int, bytes]:
    """A whole exchange: (status, body)."""
    raw = await send(port, path, body)
    try:
        await raw.read_head()
        return raw.status, await raw.body()
    finally:
        raw.close()


def stream_text(events: list[Any]) -> dict[int, str]:
    """Choice index -> its streamed text (chat deltas or completion text)."""
    out: dict[int, str] = {}
    for e in events:
        if e == "[DONE]" or "choices" not in e:
            continue
        for c in e["choices"]:
            piece = c["delta"].get("content") if "delta" in c else c.get("text")
            out[c["index"]] = out.get(c["index"], "") + (piece or "")
    return out


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
