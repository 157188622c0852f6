"""Request parsing without a server: defaults, precedence, prompt forms, what reaches SamplingParams."""

from __future__ import annotations

from typing import Any

import pytest
from fake_engine import FakeTokenizer
from rillet.http.openai.errors import ApiError
from rillet.http.openai.protocol import Limits, parse_chat, parse_completion

LIMITS = Limits("m", max_model_len=100, max_tokens_cap=80, default_max_tokens=50, max_n=4, vocab_size=257)
TOK = FakeTokenizer()


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_chat_defaults_and_template() -> None:
    gen = parse_chat(chat(), TOK, LIMITS)
    assert gen.kind == "chat" and gen.n == 1 and not gen.stream and gen.logprobs is None
    assert gen.prompts == [TOK.encode("<user>hi\n<assistant>")]
    p = gen.params[0]
    assert p.max_tokens == 50 and p.temperature == 1.0 and p.stop == () and not p.ignore_eos


def test_default_max_tokens_shrinks_to_the_room_left() -> None:
    gen = parse_chat(chat(messages=[{"role": "user", "content": "x" * 70}]), TOK, LIMITS)
    assert gen.params[0].max_tokens == 100 - len(gen.prompts[0])


def test_sampling_fields_reach_sampling_params() -> None:
    body = chat(
        max_completion_tokens=7,
        max_tokens=9,
        temperature=0,
        top_p=0.5,
        top_k=-1,
        min_p=0.1,
        seed=3,
        stop="END",
        stop_token_ids=[5],
        ignore_eos=True,
        min_tokens=2,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logprobs=True,
        top_logprobs=3,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    gen = parse_chat(body, TOK, LIMITS)
    p = gen.params[0]
    assert p.max_tokens == 7  # max_completion_tokens wins over the deprecated max_tokens
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (0.0, 0.5, 0, 0.1, 3)
    assert p.stop == ("END",) and p.stop_token_ids == (5,) and p.ignore_eos and p.min_tokens == 2
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.2, 0.5, -0.5)
    assert p.logprobs == 3 and gen.logprobs == 3
    assert gen.n == 2 and gen.stream and gen.include_usage and gen.num_choices == 2


def test_message_forms() -> None:
    msgs = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "c", "name": "bob"},
    ]
    gen = parse_chat(chat(messages=msgs), TOK, LIMITS)
    assert TOK.decode(gen.prompts[0]) == "<system>be brief\n<user>a\nb\n<assistant>\n<user>c\n<assistant>"
    with pytest.raises(ApiError) as err:
        parse_chat(chat(messages=[{"role": "function", "content": "x"}]), TOK, LIMITS)
    assert err.value.param == "messages[0].role"
    with pytest.raises(ApiError) as err:
        parse_chat(
            chat(messages=[{"role": "user", "content": "x", "tool_calls": [{"id": "a"}]}]), TOK, LIMITS
        )
    assert err.value.param == "messages[0].tool_calls"


def test_completion_prompt_forms() -> None:
    gen = parse_completion({"model": "m", "prompt": "ab", "max_tokens": 2}, TOK, LIMITS)
    assert gen.prompts == [[97, 98]] and gen.echo_texts is None
    gen = parse_completion({"model": "m", "prompt": ["ab", "c"], "n": 3, "echo": True}, TOK, LIMITS)
    assert gen.prompts == [[97, 98], [99]] and gen.num_choices == 6 and gen.echo_texts == ["ab", "c"]
    gen = parse_completion({"model": "m", "prompt": [97, 98], "echo": True}, TOK, LIMITS)
    assert gen.prompts == [[97, 98]] and gen.echo_texts == ["ab"]
    gen = parse_completion({"model": "m", "prompt": [[97], [98, 99]], "logprobs": 2}, TOK, LIMITS)
    assert gen.prompts == [[97], [98, 99]] and gen.params[0].logprobs == 2
    assert [p.max_tokens for p in gen.params] == [50, 50]


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"prompt": "x", "max_tokens": 81}, "max_tokens", "invalid_value"),  # over max_tokens_cap
        ({"prompt": "x", "n": 5}, "n", "invalid_value"),
        ({"prompt": "x" * 100}, "prompt", "context_length_exceeded"),
        ({"prompt": "x" * 30, "max_tokens": 71}, "max_tokens", "context_length_exceeded"),
        ({"prompt": ""}, "prompt", None),
        ({"prompt": "x", "temperature": True}, "temperature", "invalid_type"),
        ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids", None),
        ({"prompt": "x", "user": 5}, "user", "invalid_type"),
        ({"prompt": "x", "model": None}, "model", "missing_required_parameter"),
    ],
)
def test_completion_errors(body: dict[str, Any], param: str, code: str | None) -> None:
    with pytest.raises(ApiError) as err:
        parse_completion({"model": "m", **body}, TOK, LIMITS)
    assert err.value.status == 400 and err.value.param == param
    if code is not None:
        assert err.value.code == code


def test_integral_floats_are_integers() -> None:
    gen = parse_completion({"model": "m", "prompt": "x", "max_tokens": 3.0, "n": 2.0}, TOK, LIMITS)
    assert gen.params[0].max_tokens == 3 and gen.n == 2


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({}, (1.1, 0.0, 0.0)),  # constrained, no penalty set: the server's default
        ({"repetition_penalty": 1.0}, (1.0, 0.0, 0.0)),  # set, even to 1.0: kept as set
        ({"frequency_penalty": 0.5}, (1.0, 0.0, 0.5)),
        ({"presence_penalty": 0.0}, (1.0, 0.0, 0.0)),
    ],
)
def test_constrained_requests_get_the_default_repetition_penalty(
    fields: dict[str, Any], want: tuple[float, float, float]
) -> None:
    """structured.repetition_penalty (core/structured/defaults.py): only for a request with a grammar
    that set none of the three penalties; an unconstrained request never gets it."""
    limits = Limits("m", 100, 80, 50, 4, vocab_size=257, grammar_repetition_penalty=1.1)
    fmt = {"response_format": {"type": "json_object"}}
    p = parse_chat(chat(**fmt, **fields), TOK, limits).params[0]
    assert p.grammar is not None
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == want
    plain = parse_chat(chat(), TOK, limits).params[0]
    assert plain.grammar is None and not plain.has_penalties
    off = Limits("m", 100, 80, 50, 4, vocab_size=257)  # structured.repetition_penalty: 1.0
    assert not parse_chat(chat(**fmt), TOK, off).params[0].has_penalties


def test_chat_content_parts_name_the_spot_they_refuse() -> None:
    """Chat takes `text` parts (the same parser as /v1/responses, with its own part types), and
    images only for a vision model: here the part itself is named."""
    cases = [
        ([{"type": "image_url", "image_url": {"url": "x"}}], "messages[0].content[0]"),
        ([{"type": "input_text", "text": "a"}], "messages[0].content[0].type"),  # a Responses part
        ([{"type": "text", "text": None}], "messages[0].content[0].text"),
        ([7], "messages[0].content[0]"),
        (7, "messages[0].content"),
    ]
    for content, param in cases:
        with pytest.raises(ApiError) as err:
            parse_chat(chat(messages=[{"role": "user", "content": content}]), TOK, LIMITS)
        assert (err.value.status, err.value.param) == (400, param), content


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("allowed_token_ids", [1, 2]),
        ("bad_words", ["x"]),
        ("use_beam_search", True),
        ("prompt_logprobs", 2),
        ("truncate_prompt_tokens", 10),
        ("continue_final_message", True),
        ("chat_template_kwargs", {"enable_thinking": False}),
        ("grammar", "root ::= \"a\""),
        ("n_predict", 5),
        ("add_generation_prompt", False),
        ("stream_options", {"continuous_usage_stats": True}),
    ],
)
def test_other_servers_extensions_are_refused_by_name(field: str, value: Any) -> None:
    """vLLM's and llama.cpp's fields this server does not serve: never silently run without them."""
    for parse, body in ((parse_chat, chat()), (parse_completion, {"model": "m", "prompt": "hi"})):
        extra = {field: value, "stream": True} if field == "stream_options" else {field: value}
        with pytest.raises(ApiError) as err:
            parse({**body, **extra}, TOK, LIMITS)
        assert err.value.status == 400 and err.value.code == "unsupported_parameter"
        assert (err.value.param or "").startswith(field)
    # at their off values they pass
    parse_chat(chat(use_beam_search=False, add_generation_prompt=True, bad_words=[]), TOK, LIMITS)


def test_vllm_structured_outputs_become_grammar_specs() -> None:
    cases = [
        ({"guided_json": {"type": "object"}}, "json_schema", "guided_json"),
        ({"guided_regex": "[0-9]+"}, "regex", "guided_regex"),
        ({"guided_choice": ["a", 'b"c']}, "lark", "guided_choice"),
        ({"guided_grammar": 'start: "x"'}, "lark", "guided_grammar"),
        ({"structured_outputs": {"regex": "a+"}}, "regex", "structured_outputs.regex"),
        ({"structured_outputs": {"json_object": True}}, "json_object", "structured_outputs.json_object"),
    ]
    for extra, kind, param in cases:
        spec = parse_chat(chat(**extra), TOK, LIMITS).params[0].grammar
        assert spec is not None and (spec.kind, spec.param) == (kind, param)
    spec = parse_chat(chat(guided_choice=["a", 'b"c']), TOK, LIMITS).params[0].grammar
    assert spec is not None and spec.source == 'start: "a" | "b\\"c"'
