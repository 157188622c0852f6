"""Hypothesis strategies for hostile /tokenize and /detokenize bodies, and the check of a 200."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from fuzzing.values import NASTY_TEXT, RAW_NUMBERS, any_json, text, token_id

TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
TOKENIZE_FIELDS = [
    "model",
    "prompt",
    "content",
    "messages",
    "tools",
    "add_special_tokens",
    "add_special",
    "add_generation_prompt",
    "return_token_strs",
    "with_pieces",
]
DETOKENIZE_FIELDS = ["model", "tokens"]

_VALID: dict[str, st.SearchStrategy[Any]] = {
    "prompt": text,
    "content": text,
    "messages": st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": text}),
        min_size=1,
        max_size=3,
    ),
    "add_special_tokens": st.booleans(),
    "add_special": st.booleans(),
    "add_generation_prompt": st.booleans(),
    "return_token_strs": st.booleans(),
    "with_pieces": st.booleans(),
    "tokens": st.lists(token_id, max_size=20),
}


def _value(name: str) -> st.SearchStrategy[Any]:
    wild = st.sampled_from(NASTY_TEXT) | st.integers(-10, 300) | any_json
    valid = _VALID.get(name)
    return wild if valid is None else st.integers(0, 9).flatmap(lambda k: valid if k < 6 else wild)


@st.composite
def tokenize_body(draw: st.DrawFn, path: str, model: str) -> bytes:
    """Random JSON, random fields, raw numbers, or a valid body with some fields made hostile."""
    fields = TOKENIZE_FIELDS if path == TOKENIZE else DETOKENIZE_FIELDS
    choice = draw(st.integers(0, 5))
    if choice == 0:
        return orjson.dumps(draw(any_json))
    if choice == 1:
        names = st.sampled_from(fields) | st.text(max_size=10)
        return orjson.dumps(draw(st.dictionaries(names, any_json, max_size=6)))
    if choice == 2:
        name = draw(st.sampled_from(fields))
        return b'{"%s": %s}' % (name.encode(), draw(st.sampled_from(RAW_NUMBERS)).encode())
    body: dict[str, Any] = {"model": model}
    body[draw(st.sampled_from(["prompt", "content", "messages"])) if path == TOKENIZE else "tokens"] = "x"
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique=True)):
        body[name] = draw(_value(name))
    return orjson.dumps(body)


def check_tokenize_answer(path: str, data: Any, context: str) -> None:
    if path == DETOKENIZE:
        assert set(data) == {"prompt", "content"} and isinstance(data["prompt"], str), context
        return
    tokens = data["tokens"]
    assert isinstance(tokens, list) and data["count"] == len(tokens), context
    assert isinstance(data["max_model_len"], int), context
    for t in tokens:
        assert isinstance(t, int) or (isinstance(t, dict) and set(t) == {"id", "piece"}), context
