"""anthropic/: system and content blocks -> chat messages, tools and tool_choice -> the chat path's
ToolSetup, output_config.format, errors' types by status."""

from __future__ import annotations

from typing import Any

import pytest
from fake_engine import FakeTokenizer
from rillet.http.anthropic.errors import error_body
from rillet.http.anthropic.messages import chat_messages
from rillet.http.anthropic.protocol import count_tokens, parse_messages
from rillet.http.openai.errors import ApiError
from rillet.http.openai.protocol import Limits

LIMITS = Limits("m", 4096, 512, 64, 4, vocab_size=257)
TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}
USER = [{"role": "user", "content": "hi"}]


def test_blocks_become_chat_messages() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "...", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "42"}],
                },
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    system = [{"type": "text", "text": "rules"}, {"type": "text", "text": "more"}]
    assert chat_messages(system, messages) == [
        {"role": "system", "content": "rules\nmore"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: boom", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "thanks"},
    ]


def _parse(**body: Any) -> Any:
    return parse_messages({"model": "m", "max_tokens": 9, "messages": USER, **body}, FakeTokenizer(), LIMITS)


@pytest.mark.parametrize(
    ("choice", "mode", "named", "parallel"),
    [
        (None, "auto", None, True),
        ({"type": "auto"}, "auto", None, True),
        ({"type": "any"}, "required", None, True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", None, False),
        ({"type": "tool", "name": "f"}, "named", "f", True),
    ],
)
def test_tool_choice_maps_to_the_chat_modes(
    choice: Any, mode: str, named: str | None, parallel: bool
) -> None:
    gen = _parse(tools=[TOOL], tool_choice=choice)
    assert gen.tools is not None and (gen.tools.mode, gen.tools.named, gen.tools.parallel) == (
        mode,
        named,
        parallel,
    )
    assert _parse(tools=[TOOL], tool_choice={"type": "none"}).tools is None


def test_sampling_fields_and_stop_sequences() -> None:
    gen = _parse(
        temperature=0, top_k=5, top_p=0.5, stop_sequences=["END"], system="s", metadata={"user_id": "u"}
    )
    p = gen.params[0]
    assert (p.max_tokens, p.greedy, p.top_k, p.top_p, p.stop) == (9, True, 5, 0.5, ("END",))
    assert gen.prompts[0] == list(b"<system>s\n<user>hi\n<assistant>")
    assert count_tokens({"model": "m", "messages": USER, "system": "s"}, FakeTokenizer(), LIMITS) == len(
        gen.prompts[0]
    )


def test_output_format_is_a_grammar() -> None:
    fmt = {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}
    gen = _parse(output_config={"format": fmt, "effort": "low"})
    assert gen.grammar is not None and gen.grammar.param == "output_config.format.schema"
    with pytest.raises(ApiError):
        _parse(output_config={"format": fmt}, tools=[TOOL], tool_choice={"type": "any"})


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_error_types_follow_the_status(status: int, kind: str) -> None:
    assert error_body(ApiError(status, "why")) == {"type": "error", "error": {"type": kind, "message": "why"}}
