"""Slowloris and idle keep-alive connections vs real streaming clients, against `rillet serve`.

    .venv/bin/python tests/stress/slowloris.py                         # synthetic model
    .venv/bin/python tests/stress/slowloris.py --engine default         # SmolLM2-135M
    .venv/bin/python tests/stress/slowloris.py --max-connections 1000 --keepalive-clients \
        --over-capacity reset                                           # over the cap

Phases: warm-up; quiet run (`--clients` streaming clients x `--rounds` seed requests, each on a new
connection unless --keepalive-clients); the attack (`--slow` connections sending a header byte every
`--every` s, `--idle` idle keep-alive ones, each replaced as soon as the server closes it) with the
same run repeated beside it, with a prober opening a new connection every `--probe-every` s, until
the deadlines have closed every connection the attack held; stop; a second quiet run.

Checks (exit status 1 otherwise): every real request completes; TTFT p99 under attack within
`--max-ttft-ratio` of the quiet runs; the deadlines closed the slow and idle connections (counted
by the server and by the attacker); the server's descriptors back to the baseline. With a cap below
the attack's size (over-capacity runs) the TTFT check uses kept-alive clients and the deadline
counts are reported, not required.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request
from collections import Counter

from bench.lib.common import use_test_support

use_test_support()  # the raw HTTP client, engine hooks and attack libraries of tests/support
import orjson  # noqa: E402
from proc_helpers import ServeProcess  # noqa: E402
from rel_helpers import RawResponse, connect  # noqa: E402
from slowloris_lib import (  # noqa: E402
    Attack,
    Probe,
    RealResult,
    cpu_seconds,
    fds,
    metrics,
    p99,
    probe,
    real_clients,
    rss_mib,
    wait_fds,
)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("synthetic", "default"), default="synthetic")
    ap.add_argument("--slow", type=int, default=2000)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between a slow connection's bytes")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--keepalive-clients", action="store_true", help="real clients keep one connection each")
    ap.add_argument("--probe-every", type=float, default=0.1)
    ap.add_argument("--header-timeout", type=float, default=10.0, help="server.header_timeout_s (default's)")
    ap.add_argument("--keepalive-timeout", type=float, default=15.0, help="server.keepalive_timeout_s")
    ap.add_argument("--max-connections", type=int, default=4096)
    ap.add_argument("--over-capacity", choices=("reply_503", "reset"), default="reply_503")
    ap.add_argument("--max-ttft-ratio", type=float, default=1.5)
    return ap.parse_args()


def _run(port: int, model: str, a: argparse.Namespace) -> list[RealResult]:
    return asyncio.run(real_clients(port, model, a.clients, a.rounds, a.max_tokens, a.keepalive_clients))


async def _open(port: int, n: int) -> list[RawResponse]:
    return [await connect(port) for _ in range(n)]


def _run_in(
    loop: asyncio.AbstractEventLoop,
    port: int,
    model: str,
    a: argparse.Namespace,
    conns: list[RawResponse] | None,
) -> tuple[list[RealResult], list[Probe]]:
    """A run with the prober beside it, on `loop` (where `conns`, if any, were opened)."""

    async def go() -> tuple[list[RealResult], list[Probe]]:
        stop = asyncio.Event()
        probing = asyncio.ensure_future(probe(port, a.probe_every, stop))
        results = await real_clients(
            port, model, a.clients, a.rounds, a.max_tokens, a.keepalive_clients, conns
        )
        stop.set()
        return results, await probing

    return loop.run_until_complete(go())


def _ttfts(rs: list[RealResult]) -> list[float]:
    return [r.ttft for r in rs if r.ttft is not None]


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def main() -> int:
    a = _args()
    over_cap = a.max_connections < a.slow + a.idle
    sets = [
        f"server.header_timeout_s={a.header_timeout}",
        f"server.keepalive_timeout_s={a.keepalive_timeout}",
        f"server.max_connections={a.max_connections}",
        f"server.over_capacity={a.over_capacity}",
    ]
    sets += ["model.synthetic_step_ms=5"] if a.engine == "synthetic" else ["model.kind=auto"]
    srv = ServeProcess(*sets, ready=False)
    violations: list[str] = []
    try:
        srv.wait_for_line("ready: serving", 600)
        port, pid = srv.port, srv.proc.pid
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as r:
            model = orjson.loads(r.read())["data"][0]["id"]
        _run(port, model, a)  # warm-up
        quiet1 = _run(port, model, a)
        base_fds, base_rss = wait_fds(pid, 0, 1.0), rss_mib(pid)
        # Over the cap, kept-alive clients connect before the attack fills it (they would be
        # rejected after), and keep their connections through it.
        loop = asyncio.new_event_loop()
        held = loop.run_until_complete(_open(port, a.clients)) if over_cap and a.keepalive_clients else None
        attack = Attack(port, a.slow, a.idle, a.every)
        t_attack = time.monotonic()
        try:
            if over_cap:
                s = attack.wait_until(
                    lambda s: s["slow_open"] + s["idle_open"] >= a.max_connections, 120, "cap"
                )
            else:
                s = attack.held(0.95)
            ramp = time.monotonic() - t_attack
            # (over the cap a scrape would be one more rejected connection: the attacker's count)
            held_now = s["slow_open"] + s["idle_open"]
            open_now = held_now if over_cap else metrics(port)["rillet_open_connections"]
            peak_fds, peak_rss = fds(pid), rss_mib(pid)
            cpu0, attacker_cpu0 = cpu_seconds(pid), cpu_seconds(attack.proc.pid)
            t0 = time.monotonic()
            # Real clients run until the deadlines have closed every connection the attack held
            # (each replaced at once): their requests meet the reconnect waves too, not only the hold.
            attacked: list[RealResult] = []
            probes: list[Probe] = []
            limit = t0 + 2 * max(a.header_timeout, a.keepalive_timeout) + 60
            while True:
                rs, ps = _run_in(loop, port, model, a, held)
                attacked, probes = attacked + rs, probes + ps
                s = attack.stats()
                if over_cap and time.monotonic() - t0 >= a.header_timeout + 2 * a.every:
                    break  # a whole wave of deadline closes and the race for the freed places
                if not over_cap and s["slow_closed_408"] >= a.slow and s["idle_closed"] >= a.idle:
                    break
                if time.monotonic() > limit:
                    violations.append(f"the deadlines did not close every held connection: {s}")
                    break
            span = time.monotonic() - t0
            attack_cpu = (cpu_seconds(pid) - cpu0) / span
            attacker_cpu = (cpu_seconds(attack.proc.pid) - attacker_cpu0) / span
        finally:
            final = attack.stop()
            for c in held or []:
                c.close()
            loop.close()
        attack_s = time.monotonic() - t_attack
        settled = wait_fds(pid, base_fds, 60)
        after = metrics(port)
        quiet2 = _run(port, model, a)
    finally:
        srv.proc.terminate()
        srv.wait(60)
    quiet = quiet1 + quiet2
    for name, rs in (("quiet", quiet), ("attacked", attacked)):
        bad = Counter(r.error for r in rs if not r.ok)
        if bad:
            violations.append(f"{name}: {sum(bad.values())} of {len(rs)} real requests failed: {dict(bad)}")
    ratio = p99(_ttfts(attacked)) / p99(_ttfts(quiet)) if _ttfts(attacked) and _ttfts(quiet) else float("inf")
    if ratio > a.max_ttft_ratio and (not over_cap or a.keepalive_clients):
        violations.append(f"TTFT p99 ratio {ratio:.2f} > {a.max_ttft_ratio}")
    header_closed = after['rillet_connection_timeouts_total{deadline="header"}']
    idle_closed = after['rillet_connection_timeouts_total{deadline="keepalive"}']
    if not over_cap and (header_closed < a.slow or idle_closed < a.idle):
        violations.append(f"deadlines closed {header_closed:.0f} slow / {idle_closed:.0f} idle connections")
    if settled > base_fds:
        violations.append(f"server descriptors {settled} after the attack > baseline {base_fds}")
    outcomes = Counter(p.outcome for p in probes)
    answer_ms = {k: _ms(_median([p.seconds for p in probes if p.outcome == k])) for k in outcomes}
    body_closed = after['rillet_connection_timeouts_total{deadline="body"}']
    replied = after['rillet_connections_rejected_total{action="reply_503"}']
    reset = after['rillet_connections_rejected_total{action="reset"}']
    per_conn_kib = (peak_rss - base_rss) * 1024 / max(1, peak_fds - base_fds)
    clients = "kept-alive connections" if a.keepalive_clients else "a new connection each"
    print()
    print(
        f"engine {a.engine}; attack {a.slow} slow (a byte every {a.every:g} s) + {a.idle} idle; "
        f"{a.clients} clients x {a.rounds} seed requests of {a.max_tokens} tokens ({clients}); "
        f"header_timeout_s {a.header_timeout:g}, keepalive_timeout_s {a.keepalive_timeout:g}, "
        f"max_connections {a.max_connections} ({a.over_capacity})"
    )
    print(
        f"attack held {held_now} connections (server: {open_now:.0f} open) after a {ramp:.1f} s ramp; "
        f"lasted {attack_s:.0f} s; attacker saw {final}"
    )
    print(
        f"server: descriptors {base_fds} -> {peak_fds} -> {settled}; "
        f"RSS {base_rss:.0f} -> {peak_rss:.0f} MiB ({per_conn_kib:.1f} KiB per connection); "
        f"CPU {attack_cpu * 100:.0f} % of a core during the attacked run "
        f"(the attacker's process: {attacker_cpu * 100:.0f} %, on the same cores)"
    )
    print(
        f"server counters: header timeouts {header_closed:.0f}, keep-alive closes {idle_closed:.0f}, "
        f"body timeouts {body_closed:.0f}, rejected: 503 {replied:.0f}, reset {reset:.0f}"
    )
    print(f"new-connection probes: {dict(outcomes)}; median time to the outcome (ms) {answer_ms}")
    print()
    print("| run | requests ok | TTFT p50 ms | TTFT p99 ms |")
    print("|---|---|---|---|")
    for name, rs in (("quiet (before + after)", quiet), ("under attack", attacked)):
        t = sorted(_ttfts(rs))
        print(
            f"| {name} | {sum(r.ok for r in rs)}/{len(rs)} | {_ms(t[len(t) // 2]) if t else '-'} | "
            f"{_ms(p99(t)) if t else '-'} |"
        )
    print(f"\nTTFT p99 attacked / quiet: {ratio:.2f} (limit {a.max_ttft_ratio})")
    for v in violations:
        print(f"VIOLATION: {v}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
