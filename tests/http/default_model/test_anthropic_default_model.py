"""The Anthropic Messages API on the real default model with the `anthropic` SDK, unchanged (greedy
through `extra_body`, as this SDK has no temperature argument): messages.create equals the chat
endpoint's answer, messages.stream's text deltas join to the final message, a stop sequence, a
forced tool (tool_choice type tool) with a tool_result round trip, a missing max_tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from rillet.http.background import BackgroundServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
}
TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER}
]


@pytest.fixture(scope="module")
def claude(server: BackgroundServer) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=server.root_url, api_key="x", max_retries=0, timeout=300)
    yield client
    client.close()


def test_create_equals_the_chat_answer(
    claude: anthropic.Anthropic, client: openai.OpenAI, model: str
) -> None:
    m = claude.messages.create(model=model, max_tokens=24, messages=QUESTION, extra_body=GREEDY)  # type: ignore[arg-type]
    chat = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == chat.choices[0].message.content  # type: ignore[union-attr]
    assert m.stop_reason == ("end_turn" if chat.choices[0].finish_reason == "stop" else "max_tokens")
    assert m.usage.output_tokens == chat.usage.completion_tokens  # type: ignore[union-attr]


def test_stream_text_deltas_join_to_the_final_message(claude: anthropic.Anthropic, model: str) -> None:
    with claude.messages.stream(model=model, max_tokens=24, messages=QUESTION, extra_body=GREEDY) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0


def test_a_stop_sequence_ends_the_answer(claude: anthropic.Anthropic, model: str) -> None:
    m = claude.messages.create(
        model=model,
        max_tokens=24,
        messages=QUESTION,
        stop_sequences=["Paris"],
        extra_body=GREEDY,  # type: ignore[arg-type]
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Paris"
    assert "Paris" not in m.content[0].text  # type: ignore[union-attr]


def test_forced_tool_with_a_tool_result_round_trip(claude: anthropic.Anthropic, model: str) -> None:
    ask: dict[str, Any] = {"model": model, "tools": TOOLS, "extra_body": GREEDY}
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = claude.messages.create(
        max_tokens=60, messages=question, tool_choice={"type": "tool", "name": "get_weather"}, **ask
    )
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    use = m.content[0]
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER)
    turns = [
        *question,
        {"role": "assistant", "content": m.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}],
        },
    ]
    answer = claude.messages.create(max_tokens=24, messages=turns, **ask)  # tool_choice auto
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content


def test_missing_max_tokens_is_a_bad_request(claude: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as exc:
        # `omit` passes the SDK's own check of required arguments and leaves the field out of the body
        claude.messages.create(model=model, messages=QUESTION, max_tokens=anthropic.omit, timeout=60)  # type: ignore[arg-type]
    assert exc.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }
