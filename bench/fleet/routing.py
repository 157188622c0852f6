"""Two replicas of the default model behind a router (issue 69): cache-aware routing against a
round-robin balancer, sglang-router and vllm-router, the same multi-turn chat workload.

    flock /work/cpu.lock .venv/bin/python -m bench.fleet.routing [--conversations 8] [--turns 4] [--rounds 2]

One `rillet fleet --replicas 2` (sglang-router, cache_aware with the fleet's balance thresholds:
the fleet's own router, first), then more routers started in front of the same two replicas, one
at a time (cache_aware also with the routers' own thresholds, abs=64), each run after both
replicas' prefix caches are flushed. The workload: `--conversations` chats at once, each a long
system prompt shared by all, then `--turns` turns of a long user message (its history grows),
streamed with usage. Per run: turns/s, generated tokens/s, TTFT p50 / p90, the cached share of
each turn's prompt, the share of follow-up turns whose cached prefix covers the whole turn before
(history hit) and the share covering the system prompt, each replica's chat requests (the
system-prompt probe included). Last, a SIGKILLed replica behind the fleet's router: failed
requests inside the router's health window (health checks every --health-interval s, out after 2
failures) and after it. 2 cores here: one torch thread per replica, and they share the cores
with the router and this client.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import requests
from rillet.http.launch.routers import RouterPlan, router_command

from bench.fleet.workload import Workload, run_workload
from bench.lib.common import table, write_json
from bench.lib.server_proc import free_port, peak_rss_mib


def free_port_block(n: int) -> int:
    """The first of `n` consecutive free loopback ports (the fleet takes P .. P + 3 for two replicas)."""
    for _ in range(100):
        base = free_port()
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise SystemExit("no free block of ports")


def start_fleet(a: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port_block(4)
    argv = [
        str(Path(sys.executable).with_name("rillet")), "fleet", "--replicas", "2", "--port", str(port),
        "--set", "model.num_threads=1", "--set", f"model.max_model_len={a.max_model_len}",
        f"--router-arg=--health-check-interval-secs={a.health_interval}",
        "--router-arg=--health-failure-threshold=2",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # "fleet ready" once both replicas and the router answer
        if "fleet ready" in line:
            return proc, port
    raise SystemExit(f"the fleet exited ({proc.wait()}); see {log}")


def chat_served(url: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=10).text
    m = re.search(r'rillet_requests_total\{endpoint="/v1/chat/completions",status="200"\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def wait_ok(url: str, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready")


def measure(name: str, url: str, replicas: list[str], wl: Workload, seed: int) -> dict[str, Any]:
    for r in replicas:  # cold caches for every run; the system prompt is then cached once per replica
        requests.post(f"{r}/flush_cache", timeout=30).raise_for_status()
    before = [chat_served(r) for r in replicas]
    res = asyncio.run(run_workload(f"{url}/v1", wl, seed))
    served = [int(chat_served(r) - b) for r, b in zip(replicas, before, strict=True)]
    return {"router": name, **res, "replica_requests": served}


def extra_router(name: str, policy: str, replicas: list[str], args: list[str]) -> tuple[Any, str]:
    port = free_port()
    plan = RouterPlan(name, "127.0.0.1", port, free_port(), tuple(replicas), policy, tuple(args))
    proc = subprocess.Popen(router_command(plan), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ok(f"{url}/v1/models", proc)
    return proc, url


def kill_phase(url: str, fleet: subprocess.Popen[str], port: int, model: str) -> dict[str, Any]:
    """Sequential short requests; replica 1 SIGKILLed; errors until the router marks it unhealthy
    (its GET /workers), then 20 more requests."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)

    def ask(i: int) -> bool:
        try:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Question {i}: name a colour."}],
                max_tokens=4,
            )  # fmt: skip
            return True
        except openai.OpenAIError:
            return False

    victim = f"server.port={port + 2}"
    pids = subprocess.run(["pgrep", "-P", str(fleet.pid)], capture_output=True, text=True).stdout.split()
    pid = next(p for p in pids if victim in Path(f"/proc/{p}/cmdline").read_text().replace("\0", " "))
    subprocess.run(["kill", "-9", pid], check=True)
    t0, window, i = time.monotonic(), [], 0
    while any(
        w["url"].endswith(f":{port + 2}") and w["is_healthy"]
        for w in requests.get(f"{url}/workers", timeout=10).json()["workers"]
    ):
        window.append(ask(i))
        i += 1
    after = [ask(1000 + j) for j in range(20)]
    return {
        "window_s": round(time.monotonic() - t0, 2),
        "window_requests": len(window),
        "window_failed": window.count(False),
        "after_requests": len(after),
        "after_failed": after.count(False),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-words", type=int, default=400)
    ap.add_argument("--user-words", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--health-interval", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="every router once per round, odd rounds reversed")
    ap.add_argument("--out", default="bench/out/fleet_routing.json")
    a = ap.parse_args()
    wl = Workload(a.conversations, a.turns, a.system_words, a.user_words, a.max_tokens)
    log = Path(a.out).with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    fleet, port = start_fleet(a, log)
    replicas = [f"http://127.0.0.1:{port + 1 + i}" for i in range(2)]
    rows: list[dict[str, Any]] = []
    defaults = ["--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5"]  # the routers' own
    runs = [
        ("sglang-router cache_aware", "fleet", "cache_aware", []),
        ("sglang-router cache_aware abs=64", "sglang-router", "cache_aware", defaults),
        ("sglang-router round_robin", "sglang-router", "round_robin", []),
        ("vllm-router cache_aware", "vllm-router", "cache_aware", []),
        ("vllm-router cache_aware abs=64", "vllm-router", "cache_aware", defaults),
        ("vllm-router round_robin", "vllm-router", "round_robin", []),
    ]  # fmt: skip
    try:
        for r in range(a.rounds):  # odd rounds in reverse: a drift of the machine's load favours none
            for label, name, policy, args in runs if r % 2 == 0 else runs[::-1]:
                if name == "fleet":  # the fleet's own router
                    rows.append(measure(label, f"http://127.0.0.1:{port}", replicas, wl, a.seed))
                    continue
                proc, url = extra_router(name, policy, replicas, args)
                try:
                    rows.append(measure(label, url, replicas, wl, a.seed))
                finally:
                    proc.terminate()
                    proc.wait(30)
        model = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"][0]["id"]
        rss = [peak_rss_mib(int(p)) for p in _children(fleet.pid)]
        kill = kill_phase(f"http://127.0.0.1:{port}", fleet, port, model)
    finally:
        fleet.send_signal(signal.SIGINT)
        fleet.wait(60)
    summary = [median_row(label, [x for x in rows if x["router"] == label]) for label, *_ in runs]
    write_json(
        a.out,
        {"workload": vars(wl), "runs": rows, "summary": summary, "kill": kill, "children_peak_rss_mib": rss},
    )
    print(f"kill: {kill}")
    print(f"peak RSS of the fleet's children (MiB): {[round(r or 0) for r in rss]}")
    cols = ["router", "turns_s", "tok_s", "ttft_p50_ms", "ttft_p90_ms", "cached_frac", "history_hit",
            "system_hit", "replica_requests"]  # fmt: skip
    print(f"medians of {a.rounds} rounds (turns_s_each: every round's)")
    print(table(summary, [*cols, "turns_s_each"]))


def median_row(label: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"router": label}
    for k in ("turns_s", "tok_s", "ttft_p50_ms", "ttft_p90_ms", "cached_frac", "history_hit", "system_hit"):
        out[k] = statistics.median(x[k] for x in rows)
    out["replica_requests"] = [x["replica_requests"] for x in rows]
    out["turns_s_each"] = [round(x["turns_s"], 2) for x in rows]
    return out


def _children(pid: int) -> list[str]:
    return subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()


if __name__ == "__main__":
    main()
