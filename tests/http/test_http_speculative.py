"""Speculative decoding through the server (a tiny random model, n-gram drafts): several tokens per
sequence per step reach the client as one event, streamed text equals non-streamed text, the
metrics count drafts and accepted tokens, and a client that leaves mid-stream leaves the pool whole."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from http_helpers import serving, wait_for
from rillet.core.config import load_config
from rillet.http.background import BackgroundServer

# token ids: a random tiny Llama (vocabulary 256, the default tokenizer's first 256 tokens as text),
# whose greedy continuation of a repeated pattern repeats too, so n-gram drafts get accepted
PROMPT = [(7 * k) % 250 + 3 for k in range(9)] * 3


@pytest.fixture(scope="module")
def engine(tiny_hf_model: Any) -> Iterator[Any]:
    from rillet.core.engine.engine import Engine

    folder, _ = tiny_hf_model("llama")
    overrides = [
        f"model.path={folder}",
        "model.kind=hf",
        "model.dtype=float32",
        "scheduler.max_num_seqs=8",
        "speculative.method=ngram",
        "speculative.max_batch=8",
    ]
    eng = Engine(load_config(None, overrides))
    eng.start()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[BackgroundServer]:
    with serving(engine) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)


def _idle(engine: Any) -> bool:
    s = engine.stats()
    return s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0


def test_streamed_text_equals_non_streamed(client: openai.OpenAI, engine: Any) -> None:
    kw: dict[str, Any] = {"model": engine.model_name, "prompt": PROMPT, "max_tokens": 32, "temperature": 0}
    for n in (1, 2):
        full = client.completions.create(**kw, n=n)
        chunks = list(client.completions.create(**kw, n=n, stream=True))
        got = [
            "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
            for i in range(n)
        ]
        assert got == [c.text for c in full.choices] and got[0]
    stats = engine.stats()
    assert stats.spec_accepted > 0 and stats.spec_drafted >= stats.spec_accepted


def test_metrics_count_drafts(server: BackgroundServer, client: openai.OpenAI, engine: Any) -> None:
    client.completions.create(model=engine.model_name, prompt=PROMPT, max_tokens=24, temperature=0)
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("rillet_spec_")
    }
    assert values["rillet_spec_accepted_tokens_total"] > 0
    assert values["rillet_spec_draft_tokens_total"] >= values["rillet_spec_accepted_tokens_total"]
    assert 0 < values["rillet_spec_acceptance_rate"] <= 1
    assert values["rillet_spec_mean_accepted_length"] > 1


def test_a_client_leaving_mid_stream_leaves_the_pool_whole(server: BackgroundServer, engine: Any) -> None:
    wait_for(lambda: _idle(engine), what="engine idle before the test")
    body = json.dumps(
        {
            "model": engine.model_name,
            "prompt": PROMPT,
            "max_tokens": 200,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
    )
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    events = 0
    while events < 4:  # a few events in: the request is decoding (and drafting)
        line = resp.readline()
        assert line, "the stream ended early"
        events += line.startswith(b"data:")
    conn.close()
    wait_for(lambda: _idle(engine), timeout=60, what="the aborted request to leave the engine")
    engine.core.blocks.check_integrity()
