"""POST /v1/embeddings over a real engine: the official openai client's embeddings.create works
unchanged and its vectors equal sentence-transformers' (tiny random BERT and decoder folders,
batched and alone, float and base64); bad inputs are clear 400s; a chat model asked for embeddings
and an embedding model asked for chat are 400s; keys, metrics and admission (429) cover it."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from engine_hooks import hold_steps
from http_helpers import assert_error, post, request, serving
from rel_helpers import assert_all_released, served
from rillet.core.config import load_config
from rillet.core.engine.engine import Engine
from rillet.http.background import BackgroundServer

EMB = "/v1/embeddings"
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "a", "sun , moon ! and stars ?" * 3]
Served = tuple[Engine, BackgroundServer, Path]


def reference(folder: Path) -> Any:
    """sentence-transformers' own model over the folder (fp32, CPU): the vectors rillet must equal."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def cosines(a: Any, b: Any) -> list[float]:
    """Row-wise cosine similarity of two [N, D] arrays."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return list((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


@contextmanager
def _serve(folder: Path, *overrides: str) -> Iterator[Served]:
    config = [f"model.path={folder}", "cache.num_blocks=64", *overrides]
    engine = Engine(load_config(None, config))
    engine.start()
    try:
        with serving(engine, *config) as srv:
            yield engine, srv, folder
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def bert(st_folder: Callable[..., Path]) -> Iterator[Served]:
    with _serve(st_folder("bert")) as s:
        yield s


@pytest.fixture(scope="module")
def decoder(st_folder: Callable[..., Path]) -> Iterator[Served]:
    # a small token budget: inputs run as several prefill chunks
    with _serve(
        st_folder("decoder"),
        "scheduler.max_num_batched_tokens=16",
        "scheduler.max_num_seqs=8",
        "cache.block_size=8",
    ) as s:
        yield s


@pytest.fixture(params=["bert", "decoder"])
def server(request: pytest.FixtureRequest) -> Served:
    served_: Served = request.getfixturevalue(request.param)
    return served_


def _client(srv: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)


def test_openai_client_vectors_equal_sentence_transformers(server: Served) -> None:
    engine, srv, folder = server
    want = reference(folder).encode(TEXTS)
    client = _client(srv)
    for fmt in (openai.NOT_GIVEN, "float", "base64"):  # the client asks for base64 when not given
        r = client.embeddings.create(model=engine.model_name, input=TEXTS, encoding_format=fmt)
        got = [d.embedding for d in r.data]
        if fmt == "base64":  # handed back undecoded when asked for explicitly
            got = [np.frombuffer(base64.b64decode(e), dtype="<f4") for e in got]  # type: ignore[arg-type]
        assert [d.index for d in r.data] == list(range(len(TEXTS)))
        assert min(cosines(want, got)) >= 0.9999, (fmt, cosines(want, got))
    for text, w in zip(TEXTS, want, strict=True):
        one = client.embeddings.create(model=engine.model_name, input=text)
        assert cosines([w], [one.data[0].embedding])[0] >= 0.9999
    assert_all_released(engine, srv)


def test_body_shape_usage_and_token_id_inputs(bert: Served) -> None:
    engine, srv, _ = bert
    ids = [engine.tokenizer.encode(t) for t in TEXTS]
    r = post(srv, EMB, {"model": engine.model_name, "input": TEXTS, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == engine.model_name
    n = sum(len(i) for i in ids)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 32 for d in body["data"])
    by_text = [d["embedding"] for d in body["data"]]
    for value in (ids, ids[1]):  # a list of lists, one list of ids
        r = post(srv, EMB, {"model": engine.model_name, "input": value, "encoding_format": "float"})
        got = [d["embedding"] for d in r.json()["data"]]
        expect = by_text if value is ids else [by_text[1]]
        assert min(cosines(expect, got)) >= 0.99999


def test_dimensions_truncate_and_renormalize(bert: Served) -> None:
    engine, srv, _ = bert
    client = _client(srv)
    full = np.array(client.embeddings.create(model=engine.model_name, input=TEXTS).data[0].embedding)
    short = client.embeddings.create(model=engine.model_name, input=TEXTS, dimensions=8).data[0].embedding
    assert len(short) == 8
    assert np.allclose(short, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    r = post(srv, EMB, {"model": engine.model_name, "input": "a", "dimensions": 33})
    assert_error(r, 400, param="dimensions")
    assert "32" in r.json()["error"]["message"]


def test_over_long_input_is_a_400_naming_the_limit_or_truncated_on_request(bert: Served) -> None:
    engine, srv, folder = bert
    long_text = "the quick brown fox jumps over the lazy dog " * 8  # > 48 tokens
    r = post(srv, EMB, {"model": engine.model_name, "input": ["a", long_text]})
    assert_error(r, 400, param="input", code="context_length_exceeded")
    assert "48" in r.json()["error"]["message"] and "input[1]" in r.json()["error"]["message"]
    # truncate_prompt_tokens -1: the model's limit, as sentence-transformers cuts (keeping [SEP])
    body = {"model": engine.model_name, "input": long_text, "truncate_prompt_tokens": -1}
    got = post(srv, EMB, {**body, "encoding_format": "float"}).json()
    assert got["usage"]["prompt_tokens"] == 48
    assert cosines(reference(folder).encode([long_text]), [got["data"][0]["embedding"]])[0] >= 0.9999
    cut = post(srv, EMB, {**body, "truncate_prompt_tokens": 20}).json()
    assert cut["usage"]["prompt_tokens"] == 20


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [1, 2, 999999]}, "input"),  # outside the vocabulary
        ({"input": [[5, -1]]}, "input"),
        ({"input": ["a", 5]}, "input"),
        ({"input": {"text": "a"}}, "input"),
        ({"input": None}, "input"),
        ({"encoding_format": "hex"}, "encoding_format"),
        ({"dimensions": 0}, "dimensions"),
        ({"dimensions": "8"}, "dimensions"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 49}, "truncate_prompt_tokens"),
        ({"model": 5}, "model"),
    ],
)
def test_bad_inputs_are_clear_400s(bert: Served, patch: dict[str, Any], param: str) -> None:
    engine, srv, _ = bert
    r = post(srv, EMB, {"model": engine.model_name, "input": "hello", **patch})
    assert_error(r, 400, param=param)


def test_unknown_model_is_404_and_models_lists_the_embedding_model(bert: Served) -> None:
    engine, srv, _ = bert
    assert_error(post(srv, EMB, {"model": "nope", "input": "a"}), 404, param="model")
    models = request(srv, "GET", "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [engine.model_name]


def test_embedding_model_refuses_chat_and_completions(bert: Served) -> None:
    engine, srv, _ = bert
    chat = {"model": engine.model_name, "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {**chat, "prompt": "hi"})):
        r = post(srv, path, body)
        assert_error(r, 400, param="model", code="unsupported_task")
        assert "embeddings" in r.json()["error"]["message"]
    assert_all_released(engine, srv)


def test_chat_model_refuses_embeddings() -> None:
    with served("model.synthetic_step_ms=0") as (engine, srv):
        r = post(srv, EMB, {"model": engine.model_name, "input": "hi"})
        assert_error(r, 400, param="model", code="unsupported_task")
        assert "chat and completions" in r.json()["error"]["message"]
        # a model it does not have is a 404 first, as on every endpoint
        assert_error(post(srv, EMB, {"model": "nope", "input": "hi"}), 404, param="model")


def test_api_keys_and_metrics_cover_the_endpoint() -> None:
    keys = ("model.synthetic_step_ms=0", "model.task=both", "server.api_keys=[k1]")
    with served(*keys) as (engine, srv):
        body = {"model": engine.model_name, "input": ["a", "b"]}
        assert_error(post(srv, EMB, body), 401)
        r = post(srv, EMB, body, headers={"Authorization": "Bearer k1"})
        assert r.status_code == 200 and len(r.json()["data"]) == 2
        metrics = request(srv, "GET", "/metrics", headers={"Authorization": "Bearer k1"}).text
        assert 'rillet_requests_total{endpoint="/v1/embeddings",status="200"}' in metrics
        assert 'rillet_requests_total{endpoint="/v1/embeddings",status="401"}' in metrics
        assert_all_released(engine, srv)


def test_full_queue_is_429_for_the_whole_request_and_recovers() -> None:
    config = (
        "model.synthetic_step_ms=0",
        "model.task=both",
        "scheduler.max_waiting=4",
        "scheduler.max_num_seqs=1",
    )
    with served(*config) as (engine, srv):
        body = {"model": engine.model_name}
        answers: list[Any] = []

        def first() -> None:
            answers.append(post(srv, EMB, {**body, "input": ["a", "b", "c"]}))

        # "a" runs in a held step, "b" and "c" wait: 2 places are left for a request of 3 inputs
        with hold_steps(engine, until=lambda batch: len(answers) == 1) as holding:
            t = threading.Thread(target=first)
            t.start()
            assert holding.wait(30)
            r = post(srv, EMB, {**body, "input": ["d", "e", "f"]})
            answers.append(r)
            assert_error(r, 429)
            assert r.json()["error"]["code"] == "queue_full" and "retry-after" in r.headers
        t.join(30)
        assert answers[1].status_code == 200 and len(answers[1].json()["data"]) == 3
        assert post(srv, EMB, {**body, "input": ["d", "e", "f"]}).status_code == 200
        assert_all_released(engine, srv)


def test_one_token_id_input_longer_than_the_input_count_cap_is_one_input() -> None:
    """`input: [ids...]` is one input, whatever its length: the cap on inputs per request (the
    waiting queue's size) counts arrays, not the ids of a flat one."""
    from rillet.http.openai.embeddings import parse_embeddings
    from rillet.http.openai.errors import ApiError
    from rillet.http.openai.protocol import Limits

    limits = Limits("m", 16, 16, 16, 1, vocab_size=100, max_prompts=4)
    body: dict[str, Any] = {"model": "m", "input": list(range(1, 11))}
    assert parse_embeddings(body, None, limits, 8).inputs == [list(range(1, 11))]
    cut = parse_embeddings({**body, "input": list(range(20)), "truncate_prompt_tokens": -1}, None, limits, 8)
    assert cut.inputs == [list(range(4, 20))]
    with pytest.raises(ApiError, match="maximum input length is 16") as err:
        parse_embeddings({**body, "input": list(range(20))}, None, limits, 8)
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(ApiError, match="holds 5 inputs; at most 4"):
        parse_embeddings({**body, "input": [[1]] * 5}, None, limits, 8)
