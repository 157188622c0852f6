"""logit_bias through the chat endpoint on the real default model (greedy): -100 on the answer's first
token changes it, +100 on a token forces it, and under a grammar (response_format) the bias moves the
choice among the allowed tokens only. The compiled decode step: tests/graphs/test_logit_bias_compiled.py."""

from __future__ import annotations

import json
from typing import Any

import openai
from rillet.http.background import BackgroundServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _tokenizer(server: BackgroundServer) -> Any:
    assert server.state.engine is not None
    return server.state.engine.tokenizer


def _answer(client: openai.OpenAI, model: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=3,
        temperature=0,
        logprobs=True,
        **extra,  # type: ignore[arg-type]
    ).choices[0]


def test_bias_bans_the_first_token_and_forces_another(
    client: openai.OpenAI, model: str, server: BackgroundServer
) -> None:
    tok = _tokenizer(server)
    greedy = _answer(client, model)
    first = greedy.logprobs.content[0].token
    ids = tok.encode(first, add_special_tokens=False)
    assert len(ids) == 1, first
    banned = _answer(client, model, logit_bias={str(ids[0]): -100})
    assert banned.logprobs.content[0].token != first
    forced_id = tok.encode(" Rome", add_special_tokens=False)
    assert len(forced_id) == 1
    forced = _answer(client, model, logit_bias={str(forced_id[0]): 100})
    assert [t.token for t in forced.logprobs.content] == [" Rome"] * 3


def test_bias_under_a_grammar(client: openai.OpenAI, model: str, server: BackgroundServer) -> None:
    tok = _tokenizer(server)
    digit = [tok.encode(str(d), add_special_tokens=False) for d in range(10)]
    assert all(len(ids) == 1 for ids in digit)
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 0, "maximum": 9}},
    }

    def pick(**bias: Any) -> int:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Pick a number from 0 to 9."}],
            max_tokens=4,
            temperature=0,
            response_format=fmt,  # type: ignore[arg-type]
            **bias,
        )
        return int(json.loads(r.choices[0].message.content or ""))

    greedy = pick()
    assert pick(logit_bias={str(digit[greedy][0]): -100}) != greedy
    target = 7 if greedy != 7 else 3
    assert pick(logit_bias={str(digit[target][0]): 100}) == target
    letter = tok.encode("a", add_special_tokens=False)[0]
    assert pick(logit_bias={str(letter): 100}) == greedy  # refused by the grammar: the mask wins
