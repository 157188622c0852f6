"""`rillet serve` at TP=3 on the default SmolLM2 answers the openai client exactly as one rank does
(greedy, float32, requests batched together, JSON-constrained too), and SIGTERM stops every rank."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from http_helpers import serving
from rillet.core.config import load_config
from tp_helpers import TP_TEST_SETS, Rillet, assert_all_gone, descendants

# minutes on one core: its module is queued first under --dist loadfile (tests/conftest.py)
pytestmark = pytest.mark.slow

SETS = [
    "model.quantization=none",
    "model.dtype=float32",
    "model.max_model_len=512",
    "scheduler.max_num_seqs=8",
]
CHATS = ["Name a colour.", "What is 2 + 2?", "Say hello in French."]
PROMPTS = ["The capital of France is", "def add(a, b):"]


@pytest.fixture(scope="module")
def tp_server() -> Iterator[Rillet]:
    srv = Rillet("serve", *SETS, *TP_TEST_SETS, "parallel.tensor_parallel_size=3")
    try:
        srv.wait_for_line("ready: serving", 180)
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def reference() -> Iterator[openai.OpenAI]:
    from rillet.core.engine.engine import Engine

    engine = Engine(load_config(None, [*SETS, "model.num_threads=1"]))
    engine.start()
    try:
        with serving(engine) as srv:
            yield openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    finally:
        engine.shutdown()


def answers(client: openai.OpenAI, concurrent: bool) -> list[str]:
    model = client.models.list().data[0].id

    def chat(text: str) -> str:
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0
        )
        return r.choices[0].message.content or ""

    def complete(prompt: str) -> str:
        return (
            client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0).choices[0].text
        )

    calls: list[Any] = [(chat, c) for c in CHATS] + [(complete, p) for p in PROMPTS]
    if not concurrent:
        return [fn(arg) for fn, arg in calls]
    with ThreadPoolExecutor(len(calls)) as pool:  # all in flight at once: one batch in the engine
        return list(pool.map(lambda c: c[0](c[1]), calls))


def test_openai_answers_equal_one_rank(tp_server: Rillet, reference: openai.OpenAI) -> None:
    tp = openai.OpenAI(base_url=tp_server.base_url, api_key="x", max_retries=0)
    want = answers(reference, concurrent=False)
    assert all(a.strip() for a in want)
    assert answers(tp, concurrent=True) == want
    model = tp.models.list().data[0].id
    stream = tp.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": CHATS[0]}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want[0]


def test_structured_output_equals_one_rank(tp_server: Rillet, reference: openai.OpenAI) -> None:
    """Grammar masks apply on rank 0's sampler; the other ranks only run the forward."""
    tp = openai.OpenAI(base_url=tp_server.base_url, api_key="x", max_retries=0)

    def ask(client: openai.OpenAI) -> str:
        r = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "Give a colour as JSON."}],
            response_format={"type": "json_object"},
            max_tokens=12,
            temperature=0,
        )
        return r.choices[0].message.content or ""

    want = ask(reference)
    assert want.startswith("{")
    assert ask(tp) == want


def test_sigterm_stops_every_rank(tp_server: Rillet) -> None:
    ranks = descendants(tp_server.pid)
    assert len(ranks) >= 2, ranks  # two worker ranks (and multiprocessing's resource tracker)
    tp_server.proc.send_signal(signal.SIGTERM)
    assert tp_server.wait(60) == 0, tp_server.log
    assert "rank 1 exited with code 0" in tp_server.log and "rank 2 exited with code 0" in tp_server.log
    assert_all_gone(ranks)
