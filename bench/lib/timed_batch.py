"""A batch of C simultaneous requests (one thread and one client each, released together by a
barrier), timed, with what it cost: this client process's CPU (getrusage), the started server's
CPU and its event loop thread's, split into user mode and the kernel's (/proc, the loop being the
server's main thread), its engine thread's CPU and run-queue wait (/proc schedstat, the thread the
OS knows as "rillet-engine"), and the server's /metrics counters over the batch (the engine's hand-off
wait and steps, the dispatcher's CPU). The batches of bench/serving/stream_vs_nonstream.py and
bench/serving/config_ab.py."""

from __future__ import annotations

import resource
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from bench.lib.common import named_thread, process_cpu, thread_sched, thread_user_cpu
from bench.lib.sdk_client import one_request


@dataclass
class Batch:
    wall_s: float
    tokens: int
    chunks: int = 0
    ttft_s: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0  # CPU time this client process spent on the batch
    server_cpu_s: float | None = None  # the started server's CPU time over the batch
    loop_cpu_s: float | None = None  # ... of which its event loop thread (HTTP, SSE, routing)
    loop_user_s: float | None = None  # ... of which in user mode (the rest: the kernel's syscalls)
    engine_wait_s: float | None = None  # the engine's hand-off wait for the loop (/metrics)
    engine_steps: float | None = None
    dispatch_cpu_s: float | None = None  # the loop's CPU inside the dispatcher's callback (/metrics)
    engine_cpu_s: float | None = None  # the engine thread's CPU (/proc schedstat, by its OS name)
    engine_runq_s: float | None = None  # ... and its time runnable but waiting for a core


def client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _delta(a: float | None, b: float | None) -> float | None:
    return b - a if a is not None and b is not None else None


METRICS = (
    "rillet_handoff_wait_seconds_total",
    "rillet_engine_steps_total",
    "rillet_dispatch_cpu_seconds_total",
)


def scrape(base_url: str) -> dict[str, float]:
    """The server's counters of METRICS (those it has)."""
    root = base_url.removesuffix("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{root}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            out[name] = float(value)
    return out


def run_batch(
    clients: list[Any],
    model: str,
    stream: bool,
    max_tokens: int,
    server_pid: int | None = None,
    base_url: str | None = None,
    api: str = "chat",
) -> Batch:
    results: list[tuple[int, int, float]] = [(0, 0, 0.0)] * len(clients)
    start = threading.Barrier(len(clients) + 1)

    def work(i: int) -> None:
        start.wait()
        results[i] = one_request(clients[i], model, stream, max_tokens, api)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    # `rillet serve` runs its event loop on the main thread: thread id == process id.
    m0 = scrape(base_url) if base_url else {}
    c0, s0, l0 = client_cpu(), process_cpu(server_pid), process_cpu(server_pid, server_pid)
    u0 = thread_user_cpu(server_pid, server_pid) if server_pid else None
    engine = named_thread(server_pid)
    e0 = thread_sched(server_pid, engine)
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    c1, s1, l1 = client_cpu(), process_cpu(server_pid), process_cpu(server_pid, server_pid)
    u1 = thread_user_cpu(server_pid, server_pid) if server_pid else None
    e1 = thread_sched(server_pid, engine)
    m1 = scrape(base_url) if base_url else {}
    tokens, chunks = sum(r[0] for r in results), sum(r[1] for r in results)
    wait, steps, disp = (_delta(m0.get(k), m1.get(k)) for k in METRICS)
    batch = Batch(wall, tokens, chunks, [r[2] for r in results], c1 - c0, _delta(s0, s1), _delta(l0, l1))
    batch.engine_wait_s, batch.engine_steps, batch.dispatch_cpu_s = wait, steps, disp
    batch.loop_user_s = _delta(u0, u1)
    if e0 is not None and e1 is not None:
        batch.engine_cpu_s, batch.engine_runq_s = e1[0] - e0[0], e1[1] - e0[1]
    return batch
