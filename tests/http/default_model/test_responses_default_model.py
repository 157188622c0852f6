"""The OpenAI Responses API on the real default model with the `openai` SDK, unchanged: greedy answers
equal the chat endpoint's for the same conversation (fresh, and continued by previous_response_id),
stream events in order with deltas joining to output_text, a function-tool round trip,
`responses.parse` into a Pydantic model; and an `openai-agents` Agent with one function tool."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from rillet.http.background import BackgroundServer

QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER,
        "strict": True,
    }
]
GREEDY: dict[str, Any] = {"temperature": 0, "max_output_tokens": 24}


def _chat(client: openai.OpenAI, model: str, messages: list[dict[str, Any]]) -> str:
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=24)  # type: ignore[arg-type]
    return r.choices[0].message.content or ""


def test_create_equals_the_chat_answer(client: openai.OpenAI, model: str) -> None:
    r = client.responses.create(model=model, input=QUESTION, instructions="Answer briefly.", **GREEDY)
    assert r.output_text
    chat = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}]
    assert r.output_text == _chat(client, model, chat)
    assert r.usage is not None and r.usage.output_tokens > 0


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(model=model, input=QUESTION, **GREEDY)
    second = client.responses.create(
        model=model, input="And of Italy?", previous_response_id=first.id, **GREEDY
    )
    conversation = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And of Italy?"},
    ]
    assert second.output_text == _chat(client, model, conversation)
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_stream_events_arrive_in_order(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(model=model, input=QUESTION, **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (
        deltas
        == final.output_text
        == client.responses.create(model=model, input=QUESTION, **GREEDY).output_text
    )


def test_function_tool_round_trip(client: openai.OpenAI, model: str) -> None:
    ask = {"model": model, "tools": TOOLS, "temperature": 0, "max_output_tokens": 40}
    r = client.responses.create(
        input="What is the weather in Paris?", tool_choice="required", parallel_tool_calls=False, **ask
    )
    assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
    call = r.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    result = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": '{"sky": "sunny", "celsius": 21}',
    }
    follow = client.responses.create(input=[result], previous_response_id=r.id, **ask)  # tool_choice auto
    assert follow.status in ("completed", "incomplete") and follow.output[0].type == "message"
    assert follow.output_text


class City(BaseModel):
    name: str
    country: str


def test_parse_into_a_pydantic_model(client: openai.OpenAI, model: str) -> None:
    r = client.responses.parse(
        model=model,
        input="Give the capital of France as JSON.",
        text_format=City,
        temperature=0,
        max_output_tokens=40,
    )
    assert r.status == "completed"
    assert isinstance(r.output_parsed, City) and r.output_parsed.name


@pytest.fixture(scope="module")
def agents_client(server: BackgroundServer) -> Any:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    agents.set_default_openai_api("responses")
    agents.set_default_openai_client(
        openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300),
        use_for_tracing=False,
    )
    return agents


def test_an_agent_calls_its_tool_and_answers(agents_client: Any, model: str) -> None:
    agents = agents_client
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"It is sunny and 21 C in {city}."

    # tool_choice required for the first turn; the SDK resets it to auto after the call
    # (reset_tool_choice), so the second turn answers in text
    settings = agents.ModelSettings(
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=80
    )
    agent = agents.Agent(name="weather", model=model, tools=[get_weather], model_settings=settings)
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert calls and all(isinstance(c, str) and c for c in calls)
    assert isinstance(result.final_output, str) and result.final_output
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[0] == "ToolCallItem" and "ToolCallOutputItem" in kinds and kinds[-1] == "MessageOutputItem"
