"""A slowloris attack plus real streaming clients, against a `rillet serve` process: the attack's
driver (the attacker itself is slowloris_attacker.py, its own process), the real clients (the seed
request, streamed, each on a new connection), and the server-side readings (/proc descriptors,
/metrics). Shared by tests/reliability/test_slowloris.py and tests/stress/slowloris.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rel_helpers import RawResponse, connect, request_bytes

ATTACKER = Path(__file__).resolve().with_name("slowloris_attacker.py")
PROMPT = "What is the meaning of life?"  # the seed issue's request


class Attack:
    """The attacker process, seen from the test or the stress script."""

    def __init__(self, port: int, slow: int, idle: int, every: float = 2.0) -> None:
        self.slow, self.idle = slow, idle
        args = [sys.executable, str(ATTACKER), "--port", str(port), "--slow", str(slow), "--idle", str(idle)]
        self.proc = subprocess.Popen(
            [*args, "--every", str(every)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def wait_until(self, cond: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if cond(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"attack: timed out waiting for {what}: {s}")
            time.sleep(0.25)

    def held(self, fraction: float = 1.0) -> dict[str, Any]:
        """Waits until the attack holds (`fraction` of) all its connections at once."""
        return self.wait_until(
            lambda s: s["slow_open"] >= fraction * self.slow and s["idle_open"] >= fraction * self.idle,
            120,
            "connections held",
        )

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        self.proc.wait(60)
        return dict(json.loads(line))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# ---- the real clients and the server's side ---------------------------------------------------


@dataclass
class RealResult:
    ok: bool
    ttft: float | None = None  # send to the first content token, seconds
    tokens: int = 0
    error: str | None = None


def _seed_request(model: str, max_tokens: int) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return request_bytes("POST", "/v1/chat/completions", orjson.dumps(body))


async def _stream(raw: RawResponse, data: bytes, max_tokens: int, t0: float | None = None) -> RealResult:
    """One seed request on `raw`'s connection, read to its end; TTFT counts from `t0` (default: now)."""
    t0 = time.perf_counter() if t0 is None else t0
    res = RealResult(False)
    raw.status, raw.headers = 0, {}
    try:
        raw.writer.write(data)
        await asyncio.wait_for(raw.read_head(), 60)
        if raw.status != 200:
            await raw.body()
            return RealResult(False, error=f"HTTP {raw.status}")
        done = False
        async for now, event in raw.events():
            if event == "[DONE]":
                done = True
            elif event.get("usage") and not event.get("choices"):
                res.tokens = event["usage"]["completion_tokens"]
            elif res.ttft is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                res.ttft = now - t0
        res.ok = done and res.tokens == max_tokens
        if not res.ok:
            res.error = f"incomplete: {res.tokens} tokens, done={done}"
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
        res.error = type(exc).__name__
    return res


async def _rounds_on(raw: RawResponse, data: bytes, rounds: int, max_tokens: int) -> list[RealResult]:
    return [await _stream(raw, data, max_tokens) for _ in range(rounds)]


async def real_clients(
    port: int,
    model: str,
    clients: int,
    rounds: int,
    max_tokens: int,
    keepalive: bool = False,
    conns: list[RawResponse] | None = None,
) -> list[RealResult]:
    """`clients` concurrent streaming clients, `rounds` seed requests each, one after the other:
    each on a new connection (the harder case under attack), or all on one kept-alive connection
    (`conns`: connections opened beforehand, one per client, left open)."""
    data = _seed_request(model, max_tokens)
    if conns is not None:
        per = await asyncio.gather(*(_rounds_on(c, data, rounds, max_tokens) for c in conns))
        return [r for rs in per for r in rs]

    async def one_new() -> RealResult:
        t0 = time.perf_counter()
        try:
            raw = await connect(port)
        except OSError as exc:
            return RealResult(False, error=f"connect: {type(exc).__name__}")
        try:
            return await _stream(raw, data, max_tokens, t0)  # TTFT includes the connect
        finally:
            raw.close()

    async def client() -> list[RealResult]:
        if not keepalive:
            return [await one_new() for _ in range(rounds)]
        raw = await connect(port)
        try:
            return [await _stream(raw, data, max_tokens) for _ in range(rounds)]
        finally:
            raw.close()

    per_client = await asyncio.gather(*(client() for _ in range(clients)))
    return [r for rs in per_client for r in rs]


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metrics(port: int) -> dict[str, float]:
    """Every sample of /metrics, by its full name (labels included)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_fds(pid: int, at_most: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    n = fds(pid)
    while n > at_most and time.monotonic() < deadline:
        time.sleep(0.2)
        n = fds(pid)
    return n


@dataclass
class Probe:
    outcome: str  # "200", "503", "reset", "closed", "timeout", ...
    seconds: float  # connect to the outcome


async def probe(port: int, every: float, stop: asyncio.Event) -> list[Probe]:
    """A new connection asking GET /health every `every` s until `stop`: what a newcomer meets."""
    out: list[Probe] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        outcome = "?"
        raw: RawResponse | None = None
        try:
            raw = await asyncio.wait_for(connect(port), 10)
            raw.writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            await asyncio.wait_for(raw.read_head(), 10)
            outcome = str(raw.status)
        except ConnectionResetError:
            outcome = "reset"
        except asyncio.IncompleteReadError:
            outcome = "closed"
        except TimeoutError:
            outcome = "timeout"
        except OSError as exc:
            outcome = type(exc).__name__
        finally:
            if raw is not None:
                raw.close()
        out.append(Probe(outcome, time.perf_counter() - t0))
        await asyncio.sleep(every)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
