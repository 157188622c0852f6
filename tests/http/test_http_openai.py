"""The official `openai` client against a real server over the synthetic engine (no model compute).

The synthetic engine's tokens depend only on prompt and position, so greedy output is the same
streamed or not, alone or batched: any difference is the server's doing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from http_helpers import post, sse_events
from rillet.http.background import BackgroundServer

MESSAGES = [{"role": "user", "content": "Tell me about rivers."}]
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(synth_server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=synth_server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(synth_server: BackgroundServer) -> str:
    assert synth_server.state.engine is not None
    return synth_server.state.engine.model_name


def _chat_stream(client: openai.OpenAI, model: str, **kw: Any) -> tuple[list[Any], str]:
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_chat_stream_equals_nonstream_with_usage(client: openai.OpenAI, model: str) -> None:
    full = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, temperature=0, extra_body=NO_EOS
    )
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    assert full.model == model
    choice = full.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length"
    assert choice.message.role == "assistant" and choice.message.content
    assert full.usage is not None and full.usage.completion_tokens == 24
    assert full.usage.total_tokens == full.usage.prompt_tokens + 24

    chunks, text = _chat_stream(
        client, model, max_tokens=24, temperature=0, extra_body=NO_EOS, stream_options={"include_usage": True}
    )
    assert text == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert getattr(last.usage, key) == getattr(full.usage, key)
    # The same prompt again: its full blocks come from the prefix cache.
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens >= 16
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage(client: openai.OpenAI, model: str) -> None:
    chunks, text = _chat_stream(client, model, max_tokens=5, temperature=0)
    assert text and all(c.usage is None and c.choices for c in chunks)


def test_raw_stream_ends_with_done(synth_server: BackgroundServer, model: str) -> None:
    body = {
        "model": model,
        "messages": MESSAGES,
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = post(synth_server, "/v1/chat/completions", body)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.content)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 6
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    finish = events[-3]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "length"


def test_completions_stream_equals_nonstream(client: openai.OpenAI, model: str) -> None:
    full = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0)
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    assert full.usage is not None and full.usage.completion_tokens == 16
    chunks = list(
        client.completions.create(
            model=model,
            prompt="Once upon a time",
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_async_client_chat_and_completions(synth_server: BackgroundServer, model: str) -> None:
    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=synth_server.base_url, api_key="x", max_retries=0)
        full, stream = await asyncio.gather(
            client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0),
            client.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=12, temperature=0, stream=True
            ),
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert text == full.choices[0].message.content
        comp = await client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=7, temperature=0)
        parts = [
            c.choices[0].text
            async for c in await client.completions.create(
                model=model, prompt=[1, 2, 3], max_tokens=7, temperature=0, stream=True
            )
        ]
        assert "".join(parts) == comp.choices[0].text and comp.usage is not None
        assert comp.usage.prompt_tokens == 3
        await client.close()

    asyncio.run(run())


def test_stop_string_cuts_output(client: openai.OpenAI, model: str) -> None:
    base = client.completions.create(model=model, prompt="Stop test", max_tokens=30, temperature=0)
    text = base.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    cut = client.completions.create(
        model=model, prompt="Stop test", max_tokens=30, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    chunks = list(
        client.completions.create(
            model=model, prompt="Stop test", max_tokens=30, temperature=0, stop=stop, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == cut.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices_and_multiple_prompts(client: openai.OpenAI, model: str) -> None:
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, n=3, temperature=0)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" and c.message.content for c in chat.choices)
    assert chat.usage is not None and chat.usage.completion_tokens == 15

    streamed: dict[int, str] = {}
    for c in client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=5, n=3, temperature=0, stream=True
    ):
        for ch in c.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + (ch.delta.content or "")
    assert streamed == {c.index: c.message.content for c in chat.choices}

    comp = client.completions.create(model=model, prompt=["alpha", "beta gamma"], n=2, max_tokens=4)
    assert [c.index for c in comp.choices] == [0, 1, 2, 3]
    assert comp.usage is not None and comp.usage.completion_tokens == 16
    single = client.completions.create(model=model, prompt="beta gamma", n=2, max_tokens=4)
    assert [c.text for c in comp.choices[2:]] == [c.text for c in single.choices]


def test_echo_prepends_prompt(client: openai.OpenAI, model: str) -> None:
    plain = client.completions.create(model=model, prompt="Echo me", max_tokens=4, temperature=0)
    echoed = client.completions.create(model=model, prompt="Echo me", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "Echo me" + plain.choices[0].text
    chunks = list(
        client.completions.create(
            model=model, prompt="Echo me", max_tokens=4, temperature=0, echo=True, stream=True
        )
    )
    assert chunks[0].choices[0].text == "Echo me"
    assert "".join(c.choices[0].text for c in chunks) == echoed.choices[0].text


def test_models_endpoint(client: openai.OpenAI, model: str) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model]
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_one_wakeup_per_engine_step_at_most(
    synth_server: BackgroundServer, client: openai.OpenAI, model: str
) -> None:
    engine = synth_server.state.engine
    disp = synth_server.state.dispatcher
    assert engine is not None and disp is not None
    steps0, wakeups0, woken0 = engine.stats().steps, engine.ring.wakeups, disp.wakeups

    async def many() -> None:
        client = openai.AsyncOpenAI(base_url=synth_server.base_url, api_key="x", max_retries=0)

        async def one() -> None:
            async for _ in await client.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=40, stream=True, extra_body=NO_EOS
            ):
                pass

        await asyncio.gather(*(one() for _ in range(16)))
        await client.close()

    asyncio.run(many())
    steps = engine.stats().steps - steps0
    wakeups = engine.ring.wakeups - wakeups0
    assert steps >= 40
    assert 0 < wakeups <= steps
    assert disp.wakeups - woken0 <= wakeups + 1  # the loop side: one resume per notification
