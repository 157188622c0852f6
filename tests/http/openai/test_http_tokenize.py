"""POST /tokenize and /detokenize on a real tokenizer (the synthetic engine serves the default
model's): the ids are those a generation request is given (its usage counts them), vLLM's and
llama.cpp's field names, round trips, and a 400 naming the field for bad bodies."""

from __future__ import annotations

from typing import Any

import pytest
from http_helpers import assert_error, post
from rillet.http.background import BackgroundServer

TEXT = "Hello world! Tokenize this, please."
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def served(synth_server: BackgroundServer) -> tuple[BackgroundServer, Any, str]:
    engine = synth_server.state.engine
    assert engine is not None
    return synth_server, engine.tokenizer, engine.model_name


def test_a_prompt_gives_the_ids_a_completion_is_given(served: tuple[BackgroundServer, Any, str]) -> None:
    srv, tok, model = served
    got = post(srv, "/tokenize", {"model": model, "prompt": TEXT}).json()
    assert got["tokens"] == tok.encode(TEXT) and got["count"] == len(got["tokens"]) > 0
    assert got["max_model_len"] == srv.state.limits.max_model_len  # type: ignore[union-attr]
    done = post(srv, "/v1/completions", {"model": model, "prompt": TEXT, "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == got["count"]
    strs = post(srv, "/tokenize", {"prompt": TEXT, "return_token_strs": True}).json()["token_strs"]
    assert strs == [tok.id_to_token(i) for i in got["tokens"]]


def test_messages_give_the_ids_a_chat_completion_is_given(served: tuple[BackgroundServer, Any, str]) -> None:
    srv, _, model = served
    got = post(srv, "/tokenize", {"model": model, "messages": MESSAGES}).json()
    done = post(srv, "/v1/chat/completions", {"model": model, "messages": MESSAGES, "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == got["count"] == len(got["tokens"])
    bare = post(srv, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()["tokens"]
    assert len(bare) < got["count"] and got["tokens"][: len(bare)] == bare  # no assistant header


def test_llama_cpp_fields(served: tuple[BackgroundServer, Any, str]) -> None:
    srv, tok, _ = served
    plain = post(srv, "/tokenize", {"content": TEXT}).json()["tokens"]
    assert plain == tok.encode(TEXT, add_special_tokens=False)  # llama.cpp's add_special: off by default
    pieces = post(srv, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == plain and "".join(p["piece"] for p in pieces) == TEXT
    back = post(srv, "/detokenize", {"tokens": plain}).json()
    assert back == {"prompt": TEXT, "content": TEXT}


def test_detokenize_keeps_special_tokens(served: tuple[BackgroundServer, Any, str]) -> None:
    srv, tok, _ = served
    text = "<|im_start|>user\nHi<|im_end|>"
    ids = post(srv, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert ids == tok.encode(text, add_special_tokens=False)
    assert len(ids) < len(text) // 2  # each special token is one id
    assert post(srv, "/detokenize", {"tokens": ids}).json()["prompt"] == text


def test_bad_bodies_are_a_400_naming_the_field(served: tuple[BackgroundServer, Any, str]) -> None:
    srv, tok, model = served
    assert_error(post(srv, "/tokenize", {"model": model}), 400, "prompt", "missing_required_parameter")
    assert_error(post(srv, "/tokenize", {"prompt": TEXT, "messages": MESSAGES}), 400, "messages")
    assert_error(post(srv, "/tokenize", {"prompt": ["a", "b"]}), 400, "prompt")
    assert_error(post(srv, "/tokenize", {"messages": "hi"}), 400, "messages")
    assert_error(post(srv, "/tokenize", {"prompt": TEXT, "with_pieces": "yes"}), 400, "with_pieces")
    assert_error(post(srv, "/tokenize", {"model": "other", "prompt": TEXT}), 404, "model")
    assert_error(post(srv, "/detokenize", {}), 400, "tokens", "missing_required_parameter")
    assert_error(post(srv, "/detokenize", {"tokens": "12"}), 400, "tokens")
    assert_error(post(srv, "/detokenize", {"tokens": [1, tok.vocab_size]}), 400, "tokens")
    assert_error(post(srv, "/detokenize", {"tokens": [-1]}), 400, "tokens")
    assert_error(post(srv, "/detokenize", {"tokens": [1.5]}), 400, "tokens")
    bad = post(srv, "/detokenize", {"tokens": [1, True]})  # a bool is no token id: the element is named
    assert_error(bad, 400, "tokens")
    assert "tokens[1]" in bad.json()["error"]["message"]
