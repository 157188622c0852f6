"""`rillet fleet`: two replicas of a tiny model behind the real sglang-router (cache_aware), and
the same replicas behind the real vllm-router. Follow-up turns of concurrent conversations land
where their prefix is cached, both replicas take work, /flush_cache through the router empties
both prefix caches, a killed replica is routed around once the router's health checks see it
gone, and SIGINT stops every process of the fleet."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from fleet_helpers import (
    FleetProcess,
    chat_requests_served,
    converse,
    free_port_block,
    metric,
    served_model,
)
from rillet.http.cli import main
from rillet.http.launch.routers import RouterPlan, router_command
from tp_helpers import assert_all_gone, descendants

SETS = [
    "graphs.enabled=off",  # eager: no compile in the replicas
    "cache.num_blocks=512",
    "model.num_threads=1",
    "scheduler.max_num_seqs=8",
]
# Health checks every second, a worker out after two failures: the window the kill test waits for
HEALTH = ["--router-arg=--health-check-interval-secs=1", "--router-arg=--health-failure-threshold=2"]


@pytest.fixture(scope="module")
def fleet(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcess]:
    # the borrowed default tokenizer's ids (49152) and chat template; prompts of a few hundred tokens
    folder, _ = tiny_hf_model("llama", vocab_size=49152, max_position_embeddings=1024)
    sets = [a for s in SETS for a in ("--set", s)]
    log = tmp_path_factory.mktemp("fleet") / "fleet.log"
    f = FleetProcess("--replicas", "2", "--model", str(folder), *sets, *HEALTH, log=log)
    try:
        f.wait_ready(180)
        yield f
    finally:
        if f.proc.poll() is None:
            f.proc.kill()  # the kill test stops it with SIGINT; this is for a failure before that
            f.proc.wait(30)


def check_routing(base_url: str, replica_urls: list[str], tag: str) -> None:
    model = served_model(base_url)  # the router's /v1/models: the name it read from the workers
    assert model == served_model(replica_urls[0])
    before = [chat_requests_served(u) for u in replica_urls]
    convs = converse(base_url, model, n_conv=6, n_turns=4, tag=tag)
    # each follow-up's cached prefix covers the whole turn before (so the system prompt too)
    assert convs.history_hit_rate() >= 0.8, convs.turns
    served = [chat_requests_served(u) - b for u, b in zip(replica_urls, before, strict=True)]
    assert all(n > 0 for n in served), served  # both replicas took conversations


def flush_empties_both(base_url: str, replica_urls: list[str]) -> None:
    assert all(metric(u, "rillet_prefix_cache_blocks") > 0 for u in replica_urls)
    r = requests.post(f"{base_url}/flush_cache", timeout=30)
    assert r.status_code == 200, r.text
    assert [metric(u, "rillet_prefix_cache_blocks") for u in replica_urls] == [0.0, 0.0]


def test_bad_flags_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, flag in (
        (["--router", "nginx"], "--router"),
        (["--policy", "sticky"], "--policy"),
        (["--replicas", "0"], "--replicas"),
    ):
        assert main(["fleet", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rillet: error: {flag}: ") and err.count("\n") == 1, err


def test_router_command_balances_cache_aware_and_user_flags_come_last() -> None:
    urls = ("http://127.0.0.1:9001", "http://127.0.0.1:9002")
    extra = ("--cache-threshold", "0.5")
    plan = RouterPlan("vllm-router", "127.0.0.1", 9000, 9003, urls, "cache_aware", extra)
    argv = router_command(plan)
    assert argv[1:3] == ["-m", "vllm_router.launch_router"]
    i = argv.index("--worker-urls")
    assert argv[i + 1 : i + 3] == list(urls)
    assert argv[argv.index("--balance-abs-threshold") + 1] == "2"
    assert argv[-2:] == ["--cache-threshold", "0.5"]
    rr = router_command(RouterPlan("sglang-router", "127.0.0.1", 9000, 9003, urls, "round_robin"))
    assert rr[1:3] == ["-m", "sglang_router.launch_router"] and "--balance-abs-threshold" not in rr


def test_sglang_router_cache_aware(fleet: FleetProcess) -> None:
    replicas = [fleet.replica_url(i) for i in range(2)]
    check_routing(fleet.url, replicas, "sglang")
    flush_empties_both(fleet.url, replicas)


def test_vllm_router_cache_aware(fleet: FleetProcess, tmp_path: Path) -> None:
    """vllm-router (a fork of sglang-router) in front of the same two replicas."""
    replicas = [fleet.replica_url(i) for i in range(2)]
    port = free_port_block(2)
    plan = RouterPlan("vllm-router", "127.0.0.1", port, port + 1, tuple(replicas), "cache_aware")
    with (tmp_path / "vllm-router.log").open("w") as log:
        router = subprocess.Popen(router_command(plan), stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/v1/models", router)
        check_routing(url, replicas, "vllm")
        flush_empties_both(url, replicas)
    finally:
        router.terminate()
        router.wait(30)


def test_killed_replica_is_routed_around_then_ctrl_c_stops_all(fleet: FleetProcess) -> None:
    procs = descendants(fleet.proc.pid)
    victim = _replica_pid(procs, fleet.port + 2)
    subprocess.run(["kill", "-9", str(victim)], check=True)
    _wait_until_unhealthy(fleet.url, fleet.replica_url(1))
    client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="x", max_retries=0, timeout=60)
    model = served_model(fleet.url)
    for i in range(8):  # every request answered: none is sent to the dead replica
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"After the kill, question {i}."}],
            max_tokens=2,
        )
        assert r.choices[0].message.content is not None
    assert converse(fleet.url, model, n_conv=2, n_turns=2, tag="after-kill").turns
    fleet.proc.send_signal(signal.SIGINT)
    assert fleet.proc.wait(60) == 0, fleet.log
    assert_all_gone(procs)


def _replica_pid(pids: set[int], port: int) -> int:
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        if f"server.port={port}" in cmdline and "serve" in cmdline:
            return pid
    raise AssertionError(f"no replica on port {port} among {pids}")


def _wait_until_unhealthy(router_url: str, replica_url: str, timeout: float = 60) -> None:
    """sglang-router's GET /workers marks the worker unhealthy (or drops it) after its health
    window: health-failure-threshold checks, health-check-interval-secs apart."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = requests.get(f"{router_url}/workers", timeout=10).json()["workers"]
        if all(w["url"] != replica_url or not w["is_healthy"] for w in workers):
            return
        time.sleep(0.2)
    raise AssertionError(f"{replica_url} still healthy in the router after {timeout} s")


def _wait_http(url: str, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"router exited with {proc.returncode}"
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready after {timeout} s")
