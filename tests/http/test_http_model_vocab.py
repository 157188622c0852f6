"""Token ids past the model's vocabulary are a 400 at admission, never a failed step: a Hugging
Face folder without tokenizer.json borrows the default model's tokenizer (49152 ids), larger than
the tiny model's 256, so its text and its token-id prompts can both hold such ids. A failed step
was a 500 for the request and for every other sequence in that step."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from http_helpers import assert_error, post
from rel_helpers import assert_all_released
from rillet.core.config import load_config
from rillet.http.background import BackgroundServer

COMP = "/v1/completions"


@pytest.fixture(scope="module")
def served(tiny_hf_model: Any) -> Iterator[tuple[Any, BackgroundServer]]:
    from http_helpers import serving
    from rillet.core.engine.engine import Engine

    folder, _ = tiny_hf_model("llama")  # vocabulary 256, no tokenizer.json
    overrides = [f"model.path={folder}", "model.kind=hf", "model.task=both", "cache.num_blocks=32"]
    engine = Engine(load_config(None, overrides))
    engine.start()
    try:
        with serving(engine, *overrides) as srv:
            yield engine, srv
    finally:
        engine.shutdown()


def test_ids_past_the_models_vocabulary_are_400s(served: tuple[Any, BackgroundServer]) -> None:
    engine, srv = served
    model = engine.model_name
    big = max(engine.tokenizer.encode("Hello world, how are you today?"))
    assert big >= 256  # the borrowed tokenizer's ids run past the model's
    for prompt in ([1, 2, 300], "Hello world, how are you today?"):
        r = post(srv, COMP, {"model": model, "prompt": prompt, "max_tokens": 2})
        assert_error(r, 400, param="prompt")
        assert "vocabulary of 256" in r.json()["error"]["message"]
    r = post(srv, "/v1/embeddings", {"model": model, "input": [[1, 2], [3, 256]]})
    assert_error(r, 400, param="input")
    ok = post(srv, COMP, {"model": model, "prompt": [1, 2, 255], "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200, ok.text
    assert_all_released(engine, srv)
