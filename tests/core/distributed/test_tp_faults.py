"""Faults under tensor parallelism: a worker killed or hung mid-stream, a rank that cannot load, a
rank 0 killed outright. The server never hangs: clients get an error event then [DONE], queued
requests a 503 `dead`, the process exits 1, and no process of any rank is left behind."""

from __future__ import annotations

import http.client
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from faulty_rillet import LOAD_FAIL_RANK
from http_helpers import SYNTH_OVERRIDES, post, request, wait_for
from rillet.core.config import config_from_dict, load_config
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from tp_helpers import TINY_TP, TP_TEST_SETS, Rillet, assert_all_gone, descendants

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

Start = Callable[..., Rillet]


@pytest.fixture
def start(tiny_hf_model: Any) -> Callable[..., Rillet]:
    folder, _ = tiny_hf_model("llama", **TINY_TP)
    started: list[Rillet] = []

    def make(*sets: str, faults: dict[str, str] | None = None) -> Rillet:
        srv = Rillet(
            "serve",
            *TP_TEST_SETS,
            "parallel.tensor_parallel_size=2",
            f"model.path={folder}",
            "model.kind=hf",
            "model.dtype=float32",
            *sets,
            faults=faults,
        )
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.kill()


def worker_pid(srv: Rillet) -> int:
    srv.wait_for_line("this host's workers", 60)
    m = re.search(r"rank 1 pid (\d+)", srv.log)
    assert m, srv.log
    return int(m.group(1))


def stream_into(port: int, body: dict[str, Any], events: list[Any]) -> threading.Thread:
    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        hdrs = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/completions", orjson.dumps({**body, "stream": True}), hdrs)
        r = conn.getresponse()
        if r.status != 200:
            events.append({"status": r.status, "body": r.read().decode()})
            return
        for line in r:
            if line.startswith(b"data: "):
                data = line[6:].strip()
                events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
        conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(
    ("sig", "why"),
    [(signal.SIGKILL, "killed by SIGKILL"), (signal.SIGSTOP, "no heartbeat")],
    ids=["killed", "hung"],
)
def test_worker_lost_mid_stream(start: Start, sig: signal.Signals, why: str) -> None:
    srv = start("scheduler.max_num_seqs=1")  # one running stream, one request queued behind it
    pid = worker_pid(srv)
    srv.wait_for_line("ready: serving", 120)
    procs = descendants(srv.pid)
    model = request(srv, "GET", "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 240, "ignore_eos": True}
    events: list[Any] = []
    streaming = stream_into(srv.port, body, events)
    wait_for(lambda: len(events) >= 3 or "status" in (events or [{}])[0], 60, "the stream has started")
    assert "status" not in events[0], events
    queued: list[Any] = []
    waiting = threading.Thread(
        target=lambda: queued.append(post(srv, "/v1/completions", {**body, "max_tokens": 4})), daemon=True
    )
    waiting.start()
    wait_for(lambda: _waiting(srv) == 1, 30, "a request queued behind the stream")
    os.kill(pid, sig)
    streaming.join(120)
    waiting.join(120)
    assert srv.wait(120) == 1, srv.log
    assert events[-1] == "[DONE]", events[-3:]
    err = events[-2]["error"]
    assert err["code"] == "dead" and "rank 1" in err["message"] and why in err["message"], err
    assert queued[0].status_code == 503 and queued[0].json()["error"]["code"] == "dead", queued
    assert_all_gone(procs | {pid})


def _waiting(srv: Rillet) -> int:
    m = re.search(r"^rillet_num_requests_waiting (\S+)$", request(srv, "GET", "/metrics").text, re.M)
    return int(float(m.group(1))) if m else -1


def test_load_error_names_the_rank(start: Start) -> None:
    srv = start(faults={LOAD_FAIL_RANK: "1"})
    pid = worker_pid(srv)
    assert srv.wait(120) == 1, srv.log
    assert "tensor-parallel rank 1 failed to load the model: RuntimeError: test-only load failure" in srv.log
    assert_all_gone({pid})


def test_rank0_killed_takes_its_workers(start: Start) -> None:
    srv = start()
    srv.wait_for_line("ready: serving", 120)
    procs = descendants(srv.pid)
    assert worker_pid(srv) in procs
    srv.proc.kill()  # SIGKILL: no cleanup code runs in rank 0
    srv.wait(30)
    assert_all_gone(procs)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_engine_fail_from_another_thread_stops_an_idle_engine() -> None:
    """What the monitor calls when a rank dies between steps: the engine thread dies at once,
    and requests are refused as dead."""
    from rillet.core.engine.engine import Engine
    from rillet.core.errors import EngineDeadError
    from rillet.core.sampling_params import SamplingParams

    engine = Engine(load_config(None, SYNTH_OVERRIDES))
    engine.start()
    try:
        engine.fail("tensor-parallel rank 1 (pid 1) was killed by SIGKILL")
        wait_for(lambda: not engine.healthy, 10, "the engine thread died")
        assert engine.error is not None and "rank 1 (pid 1) was killed by SIGKILL" in engine.error
        with pytest.raises(EngineDeadError):
            engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2))
    finally:
        engine.shutdown()


def test_an_engine_idle_past_the_collective_timeout_keeps_its_workers(tiny_hf_model: Any) -> None:
    """parallel.timeout_s bounds a step's collectives, not the time between steps: a worker waiting
    for the next step of an idle server (here 3x the timeout) is not taken as failed."""
    folder, _ = tiny_hf_model("llama", **TINY_TP)
    cfg = config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "num_threads": 1},
            "cache": {"num_blocks": 24, "block_size": 8},
            "parallel": {"tensor_parallel_size": 2, "timeout_s": 1.0},
        }
    )
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    with LLM(cfg) as llm:
        first = llm.generate([[1, 2, 3]], params)[0].outputs[0].token_ids
        time.sleep(3.0)  # idle: no step sent, the worker waits for the next header
        cluster = llm.engine.runtime.cluster
        assert cluster is not None and cluster.failure is None and cluster._exited() is None
        assert llm.generate([[1, 2, 3]], params)[0].outputs[0].token_ids == first
