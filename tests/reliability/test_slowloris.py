"""The CI-sized slowloris run: 2,000 slow-header connections (a byte every 2 s) and 500 idle
keep-alive connections against `rillet serve` (synthetic model, 15 s deadlines), while 16 real
clients stream the seed request, each request on a new connection.

Asserted (mechanism, not speed): every real request completes; the server held the attack's
connections; the deadlines closed every slow and idle one (the server's counters and the
attacker's count agree, each slow one got its 408); the log says so at most once per interval;
the server's descriptors (from /proc) return to the baseline. The TTFT p99 ratio is printed
here and measured, quiet, by bench/stress/slowloris.py (bench/stress/README.md).
"""

from __future__ import annotations

import asyncio
import resource
import time
import urllib.request

import orjson
from proc_helpers import ServeProcess
from slowloris_lib import Attack, RealResult, fds, metrics, p99, real_clients, wait_fds

SLOW, IDLE = 2000, 500
CLIENTS, ROUNDS, MAX_TOKENS = 16, 2, 16
# Longer than opening the whole attack takes on a loaded 2-core box (~300 connections a second
# seen there: 8 s for 2,500), so the attack is held at once before the first deadline closes any;
# at 3 s a loaded run never held more than 918 of them.
DEADLINE_S = 15
CONFIG = (
    "model.synthetic_step_ms=5",
    f"server.header_timeout_s={DEADLINE_S}",
    f"server.body_timeout_s={DEADLINE_S}",
    f"server.keepalive_timeout_s={DEADLINE_S}",
)
# Descriptors a connection costs the attacker's process (its socket) and the server's (its socket).
_SPARE_FDS = 200


def _sizes() -> tuple[int, int]:
    """The attack's size, scaled down where the hard descriptor limit would not hold it."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    room = hard - _SPARE_FDS if hard != resource.RLIM_INFINITY else SLOW + IDLE
    if room >= SLOW + IDLE:
        return SLOW, IDLE
    print(f"hard descriptor limit {hard}: attack scaled to {room} connections")
    return room * SLOW // (SLOW + IDLE), room * IDLE // (SLOW + IDLE)


def _run(port: int, model: str, rounds: int) -> list[RealResult]:
    results = asyncio.run(real_clients(port, model, CLIENTS, rounds, MAX_TOKENS))
    bad = [r.error for r in results if not r.ok]
    assert not bad, bad
    return results


def test_slowloris_and_idle_connections_do_not_starve_real_clients() -> None:
    slow, idle = _sizes()
    srv = ServeProcess(*CONFIG)
    try:
        port, pid = srv.port, srv.proc.pid
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
            model = orjson.loads(r.read())["data"][0]["id"]
        _run(port, model, 1)  # warm-up
        quiet = _run(port, model, ROUNDS)
        baseline = wait_fds(pid, 0, 1.0)  # settled: what the idle server holds
        attack = Attack(port, slow, idle)
        t0 = time.monotonic()
        try:
            attack.held(0.9)
            peak_fds, during = fds(pid), metrics(port)
            attacked = _run(port, model, ROUNDS)
            # Every connection held at the start must have met its deadline by now or soon.
            final = attack.wait_until(
                lambda s: s["slow_closed_408"] >= slow and s["idle_closed"] >= idle, 60, "the deadlines"
            )
        finally:
            final = attack.stop()
        elapsed = time.monotonic() - t0
        after = metrics(port)
        settled = wait_fds(pid, baseline, 60)
    finally:
        srv.proc.terminate()
        srv.wait(30)
    ratio = p99([r.ttft for r in attacked if r.ttft]) / p99([r.ttft for r in quiet if r.ttft])
    print(
        f"attack {slow} slow + {idle} idle; server fds {baseline} -> {peak_fds} -> {settled}; "
        f"open connections during {during['rillet_open_connections']:.0f}; attacker {final}; "
        f"TTFT p99 quiet {p99([r.ttft for r in quiet if r.ttft]) * 1000:.1f} ms, "
        f"attacked {p99([r.ttft for r in attacked if r.ttft]) * 1000:.1f} ms (x{ratio:.2f})"
    )
    assert len(attacked) == CLIENTS * ROUNDS and all(r.tokens == MAX_TOKENS for r in attacked)
    # The server really held the attack (each connection is a descriptor there).
    assert during["rillet_open_connections"] >= 0.9 * (slow + idle)
    assert peak_fds >= baseline + 0.9 * (slow + idle)
    # The deadlines closed them: counted by the server, seen by the attacker (slow ones with a 408).
    assert after['rillet_connection_timeouts_total{deadline="header"}'] >= slow
    assert after['rillet_connection_timeouts_total{deadline="keepalive"}'] >= idle
    assert final["slow_closed_408"] >= slow and final["idle_closed"] >= idle
    assert final["connect_errors"] == 0 and final["rejected_503"] == 0, final  # under the cap: all admitted
    # Thousands of closes, one log line per client address per minute.
    closes_logged = sum("connection from 127.0.0.1 closed" in line for line in srv.lines)
    assert 1 <= closes_logged <= 1 + elapsed // 60, closes_logged
    assert any("open files limit: soft" in line for line in srv.lines)
    assert settled <= baseline, (baseline, settled)
