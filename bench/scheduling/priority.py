"""Request priority (scheduler.policy): an interactive request's TTFT behind a flood of batch jobs.

Two servers on the synthetic model (`model.kind: synthetic`: fixed step time, no compute, the real
scheduler, ring and HTTP stack), `fcfs` and `priority`, side by side, rounds alternating (an idle
server costs no CPU). A round on each: the urgent request alone on the idle server (its idle TTFT);
then a flood of `--flood` requests of `--flood-tokens` tokens (priority 0; more than the
`--places` batch places: the rest wait), and once the flood is queued (the server's
rillet_num_requests_waiting says so), the urgent request again, streamed, with priority -1 under
`priority` (0 under fcfs, which refuses any other) — its TTFT behind the flood. Reported: TTFT p50
and max idle and behind the flood, their ratio, the flood's makespan (what letting the urgent one
in costs the batch jobs), preemptions per round (/metrics), server and client peak RSS.

    .venv/bin/python -m bench.scheduling.priority [--places 16] [--flood 64] [--flood-tokens 200]
        [--urgent-tokens 16] [--rounds 5] [--step-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

import aiohttp

from bench.lib.common import peak_rss_mib, table, write_json
from bench.lib.loadgen import RequestResult, chat_body, one_request
from bench.lib.server_proc import RilletServer, scrape_metrics
from bench.serving.serve_sweep import served_model

POLICIES = ("fcfs", "priority")
URGENT_PRIORITY = {"fcfs": 0, "priority": -1}


def overrides(policy: str, a: argparse.Namespace) -> list[str]:
    return [
        "model.kind=synthetic",
        f"model.synthetic_step_ms={a.step_ms}",
        f"scheduler.max_num_seqs={a.places}",
        f"scheduler.policy={policy}",
        "logging.level=WARNING",
    ]


async def urgent(session: aiohttp.ClientSession, url: str, model: str, policy: str, tokens: int) -> float:
    body = chat_body(model, "Answer now: what time is it?", tokens, True)
    body["priority"] = URGENT_PRIORITY[policy]
    r = await one_request(session, url, body, None)
    assert r.ok and r.ttft is not None, r.error
    return r.ttft


async def queued(srv: RilletServer, n: int) -> None:
    """Until the server holds at least n waiting requests (the flood is in)."""
    root = srv.base_url.removesuffix("/v1")
    deadline = time.monotonic() + 30
    while (await asyncio.to_thread(scrape_metrics, root)).get("rillet_num_requests_waiting", 0) < n:
        if time.monotonic() > deadline:
            raise TimeoutError("the flood never queued")
        await asyncio.sleep(0.01)


async def one_round(srv: RilletServer, model: str, policy: str, a: argparse.Namespace) -> dict[str, float]:
    url = srv.base_url + "/chat/completions"
    root = srv.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        idle = await urgent(session, url, model, policy, a.urgent_tokens)
        before = preemptions(root)
        t0 = time.perf_counter()
        flood = [
            asyncio.create_task(
                one_request(
                    session, url, chat_body(model, f"Batch job {i}: summarise.", a.flood_tokens, False), None
                )
            )
            for i in range(a.flood)
        ]
        await queued(srv, a.flood - a.places)
        busy = await urgent(session, url, model, policy, a.urgent_tokens)
        done: list[RequestResult] = await asyncio.gather(*flood)
        makespan = time.perf_counter() - t0
    assert all(r.ok and r.tokens == a.flood_tokens for r in done), [r.error for r in done if not r.ok]
    return {"idle": idle, "busy": busy, "makespan": makespan, "preemptions": preemptions(root) - before}


def preemptions(root: str) -> float:
    m = scrape_metrics(root)
    return m.get("rillet_num_preemptions_total", m.get("rillet_num_preemptions", 0.0))


def row(policy: str, runs: list[dict[str, float]], rss: float | None) -> dict[str, Any]:
    idle, busy = [r["idle"] for r in runs], [r["busy"] for r in runs]
    p50_idle, p50_busy = statistics.median(idle), statistics.median(busy)
    return {
        "policy": policy,
        "rounds": len(runs),
        "idle_ttft_p50_ms": p50_idle * 1000,
        "flood_ttft_p50_ms": p50_busy * 1000,
        "flood_ttft_max_ms": max(busy) * 1000,
        "flood_vs_idle": p50_busy / p50_idle,
        "flood_makespan_s": statistics.median(r["makespan"] for r in runs),
        "preemptions_per_round": statistics.mean(r["preemptions"] for r in runs),
        "server_peak_rss_mib": rss,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--places", type=int, default=16, help="batch places: scheduler.max_num_seqs")
    ap.add_argument("--flood", type=int, default=64, help="low-priority requests per round")
    ap.add_argument("--flood-tokens", type=int, default=200)
    ap.add_argument("--urgent-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=5.0, help="the synthetic model's step time")
    ap.add_argument("--out", default="bench/out/priority.json")
    a = ap.parse_args()
    assert a.flood > a.places, "the flood must outnumber the batch places"
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    with contextlib.ExitStack() as stack:
        servers = {p: stack.enter_context(RilletServer(overrides(p, a))) for p in POLICIES}
        models = {p: served_model(srv.base_url, "auto") for p, srv in servers.items()}
        for r in range(a.rounds):
            for p in POLICIES[r % 2 :] + POLICIES[: r % 2]:  # who goes first alternates
                runs[p].append(asyncio.run(one_round(servers[p], models[p], p, a)))
                print(f"  round {r} {p}: {runs[p][-1]}", flush=True)
        rss = {p: srv.peak_rss_mib() for p, srv in servers.items()}
    rows = [row(p, runs[p], rss[p]) for p in POLICIES]
    config = {
        k: getattr(a, k) for k in ("places", "flood", "flood_tokens", "urgent_tokens", "rounds", "step_ms")
    }
    write_json(a.out, {"config": config, "rows": rows, "runs": runs, "client_peak_rss_mib": peak_rss_mib()})
    print(f"client peak RSS {peak_rss_mib():.0f} MiB; JSON: {a.out}")
    cols = [
        "policy",
        "rounds",
        "idle_ttft_p50_ms",
        "flood_ttft_p50_ms",
        "flood_ttft_max_ms",
        "flood_vs_idle",
        "flood_makespan_s",
        "preemptions_per_round",
        "server_peak_rss_mib",
    ]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
