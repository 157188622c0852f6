"""Images through the official SDKs, unchanged: `openai` (chat completions and Responses) and
`anthropic` (Messages, count_tokens), on the fake engine with a fake vision front. Each image
reaches the engine decoded and in order, the usage counts its tokens, streamed and not alike, and
a bad image is the SDK's BadRequestError naming the part."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from fake_engine import FakeEngine
from http_doubles.fake_vision import FakeVision, PartsTokenizer
from http_doubles.images import b64, data_url, image_bytes
from http_helpers import serving
from rillet.core.config import load_config
from rillet.core.vision.image import decode_image

MODEL = "fake-model"
PNG, WEBP = image_bytes(16, 16), image_bytes(32, 8, "WEBP", (10, 200, 10))


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeEngine, openai.OpenAI, anthropic.Anthropic]]:
    cfg = load_config(None, ["vision.max_images=4"])
    engine = FakeEngine(cfg)
    engine.tokenizer = PartsTokenizer()
    engine.vision = FakeVision(cfg.vision.max_images, cfg.vision.max_pixels)
    engine.start()
    with serving(engine, cfg=cfg) as srv:
        yield (
            engine,
            openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0),
            anthropic.Anthropic(base_url=srv.root_url, api_key="x", max_retries=0),
        )
    engine.shutdown()


def seen(engine: FakeEngine) -> list[bytes]:
    """The content hashes of the images the last expand got."""
    assert isinstance(engine.vision, FakeVision)
    return [i.content_hash for i in engine.vision.calls[-1]]


def hashes(*images: bytes) -> list[bytes]:
    return [decode_image(b, "p", 10**6).content_hash for b in images]


def test_openai_chat(served: Any) -> None:
    engine, client, _ = served
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Which is greener?"},
                {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}},
                {"type": "image_url", "image_url": {"url": data_url(WEBP, "image/webp")}},
            ],
        }
    ]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0)
    assert seen(engine) == hashes(PNG, WEBP)
    prompt = engine.added[-1].prompt_ids
    assert full.usage is not None and full.usage.prompt_tokens == len(prompt)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(prompt)
    bad: Any = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!"}}]}
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=bad, max_tokens=5)
    body: Any = err.value.body
    assert (body["param"], body["code"]) == ("messages[0].content[0]", "not_base64")


def test_openai_responses(served: Any) -> None:
    engine, client, _ = served
    content: Any = [
        {"type": "input_text", "text": "Describe"},
        {"type": "input_image", "image_url": data_url(WEBP, "image/webp"), "detail": "auto"},
    ]
    r = client.responses.create(
        model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=4
    )
    assert seen(engine) == hashes(WEBP)
    assert r.usage is not None and r.usage.input_tokens == len(engine.added[-1].prompt_ids)
    events = list(
        client.responses.create(
            model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=4, stream=True
        )
    )
    final = events[-1].response  # incomplete: max_output_tokens
    assert final.usage is not None and final.usage.input_tokens == r.usage.input_tokens
    bad: Any = [
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(b"not an image")}]}
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=bad, max_output_tokens=4)
    body: Any = err.value.body
    assert (body["param"], body["code"]) == ("input[0].content[0]", "not_an_image")


def test_anthropic_messages(served: Any) -> None:
    engine, _, claude = served
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
                {"type": "text", "text": "and"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/webp", "data": b64(WEBP)},
                },
            ],
        }
    ]
    m = claude.messages.create(model=MODEL, max_tokens=4, messages=messages)
    assert seen(engine) == hashes(PNG, WEBP)
    assert m.usage.input_tokens == len(engine.added[-1].prompt_ids)
    assert claude.messages.count_tokens(model=MODEL, messages=messages).input_tokens == m.usage.input_tokens
    with claude.messages.stream(model=MODEL, max_tokens=4, messages=messages) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens == m.usage.input_tokens
    bad: Any = [
        {
            "role": "user",
            "content": [{"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}],
        }
    ]
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model=MODEL, max_tokens=4, messages=bad)
    assert "messages.0.content.0:" in str(err.value) and "vision.allowed_domains" in str(err.value)
