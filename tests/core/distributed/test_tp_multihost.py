"""Two "hosts" on 127.0.0.1: `rillet serve` is host 0 (rank 0), `rillet worker` is host 1 (rank 1).
Same greedy answers as one rank through the openai client; SIGTERM to the server stops both."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from tp_helpers import TINY_TP, TP_TEST_SETS, Rillet, assert_all_gone, descendants

PROMPTS = [[5, 6, 7, 8], [100, 3, 9, 27, 81, 243, 4, 16, 64], [42]]
NEW = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def two_hosts(tiny_hf_model: Any) -> Iterator[tuple[Rillet, Rillet, str]]:
    folder, _ = tiny_hf_model("llama", **TINY_TP)
    shared = [
        *TP_TEST_SETS,
        "parallel.tensor_parallel_size=2",
        "parallel.nnodes=2",
        f"parallel.master_port={free_port()}",
    ]
    # the worker host first: it waits for rank 0's store to appear
    worker = Rillet("worker", *shared, "parallel.node_rank=1")
    server = Rillet("serve", *shared, f"model.path={folder}", "model.kind=hf", "model.dtype=float32")
    try:
        server.wait_for_line("ready: serving", 120)
        yield server, worker, str(folder)
    finally:
        server.kill()
        worker.kill()


def test_two_hosts_answer_as_one_rank(two_hosts: tuple[Rillet, Rillet, str]) -> None:
    server, worker, folder = two_hosts
    # the worker's log is read by a thread: its line may land after the server's (seen under xdist)
    worker.wait_for_line("rank 1 rillet.core.distributed.worker: ready", 60)
    cfg = config_from_dict({"model": {"path": folder, "kind": "hf", "dtype": "float32", "num_threads": 1}})
    with LLM(cfg) as llm:
        params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
        want = [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    r = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=PROMPTS,
        max_tokens=NEW,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    got = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert got == want
    assert r.usage is not None and r.usage.completion_tokens == NEW * len(PROMPTS)


def test_sigterm_to_the_server_stops_the_other_host(two_hosts: tuple[Rillet, Rillet, str]) -> None:
    server, worker, _ = two_hosts
    procs = descendants(server.pid) | descendants(worker.pid) | {worker.pid}
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(60) == 0, server.log
    assert worker.wait(60) == 0, worker.log
    assert "ranks ended: 1 exited with code 0" in worker.log
    assert_all_gone(procs)
