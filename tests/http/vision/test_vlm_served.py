"""Issue 70's must-show, end to end: a tiny Qwen2-VL folder saved by transformers, served by a real
rillet server over a real engine, answers images sent through the official `openai` SDK (chat
completions, streamed and not, and the Responses API) and the `anthropic` SDK (Messages) with
transformers' greedy tokens; `usage.prompt_tokens` counts the image tokens; the prefix cache hits on
the same image and misses on a different image of the same size; an `http://127.0.0.1/...` image
is a 400 naming the part. The decode step runs eagerly here (graphs.enabled=off): the compiled step
over images is tests/core/vision/test_qwen_vl_engine.py's, and compiling would dominate this file."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import openai
import pytest
from http_doubles.images import b64, data_url
from http_helpers import sdk_clients
from PIL import Image
from rillet.core.vision.image import ImageInput, decode_image
from tiny_models.qwen_vl import IMAGE_TOKEN_ID, chat_ids, hf_generate, make_qwen_vl, tokenizer

NEW = 6
MODEL = "qwen2-vl-tiny"
BLOCK = 16  # cache.block_size, set below
ATOL = 1e-4  # fp32 logprobs through a different summation order


def png_bytes(seed: int, height: int, width: int) -> bytes:
    arr = np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def as_input(data: bytes) -> ImageInput:
    return decode_image(data, "image", 10**8)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    folder = tmp_path_factory.mktemp("qwen2_vl")
    model, processor = make_qwen_vl(folder, "qwen2_vl")
    return folder, model, processor


@pytest.fixture(scope="module")
def clients(qwen: tuple[Path, Any, Any]) -> Iterator[tuple[openai.OpenAI, anthropic.Anthropic]]:
    overrides = [
        f"model.path={qwen[0]}",
        f"model.served_name={MODEL}",
        "cache.num_blocks=256",
        f"cache.block_size={BLOCK}",
        "graphs.enabled=off",
    ]
    with sdk_clients(overrides) as both:
        yield both


def want(qwen: tuple[Path, Any, Any], images: list[bytes], text: str) -> tuple[int, list[int]]:
    """transformers' (expanded prompt length, greedy tokens) for a user turn of `images`, `text`."""
    expanded, tokens, _ = hf_generate(
        qwen[1], qwen[2], chat_ids(len(images), text), [as_input(i) for i in images], NEW
    )
    return len(expanded), tokens


def token_bytes(ids: list[int]) -> list[list[int]]:
    """Each id's bytes as OpenAI's logprobs report them, from transformers' tokenizer."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    tok = tokenizer()
    return [[to_byte[c] for c in tok.convert_ids_to_tokens(i)] for i in ids]


def decoded(ids: list[int]) -> str:
    return bytes(b for t in token_bytes(ids) for b in t).decode("utf-8", errors="replace")


def chat_content(images: list[bytes], text: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return [*parts, {"type": "text", "text": text}]


def chat(client: openai.OpenAI, images: list[bytes], text: str, **kw: Any) -> Any:
    messages: Any = [{"role": "user", "content": chat_content(images, text)}]
    return client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=NEW,
        temperature=0,
        logprobs=True,
        extra_body={"ignore_eos": True},
        **kw,
    )


ONE = [png_bytes(1, 40, 60)]
TWO = [png_bytes(2, 70, 30), png_bytes(3, 40, 90)]


@pytest.mark.parametrize("images", [ONE, TWO], ids=["one image", "two sizes"])
def test_openai_chat_matches_transformers(qwen: Any, clients: Any, images: list[bytes]) -> None:
    client, _ = clients
    text = "What is in the picture?"
    prompt_len, tokens = want(qwen, images, text)
    full = chat(client, images, text)
    assert [e.bytes for e in full.choices[0].logprobs.content] == token_bytes(tokens)
    assert full.choices[0].message.content == decoded(tokens)
    assert full.usage.prompt_tokens == prompt_len > len(chat_ids(len(images), text))
    assert full.usage.completion_tokens == NEW
    chunks = list(chat(client, images, text, stream=True, stream_options={"include_usage": True}))
    streamed = [
        e.bytes for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert streamed == token_bytes(tokens)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == decoded(tokens)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == prompt_len


def test_anthropic_and_responses_match_transformers(qwen: Any, clients: Any) -> None:
    client, claude = clients
    text = "Describe it."
    prompt_len, tokens = want(qwen, ONE, text)
    source = {"type": "base64", "media_type": "image/png", "data": b64(ONE[0])}
    content: Any = [{"type": "image", "source": source}, {"type": "text", "text": text}]
    m = claude.messages.create(
        model=MODEL,
        max_tokens=NEW,
        messages=[{"role": "user", "content": content}],
        extra_body={"ignore_eos": True, "temperature": 0},  # this SDK's create() has no temperature
    )
    assert "".join(b.text for b in m.content if b.type == "text") == decoded(tokens)
    # Anthropic's input_tokens leave out the tokens read from the cache
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == prompt_len
    parts: Any = [
        {"type": "input_image", "image_url": data_url(ONE[0])},
        {"type": "input_text", "text": text},
    ]
    r = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": parts}],
        max_output_tokens=NEW,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.output_text == decoded(tokens)
    assert r.usage is not None and r.usage.input_tokens == prompt_len


def test_prefix_cache_keys_on_the_image(qwen: Any, clients: Any) -> None:
    client, _ = clients
    text = "Which colour dominates here?"
    first, other = png_bytes(10, 56, 84), png_bytes(11, 56, 84)
    ids = chat_ids(1, text)
    start = ids.index(IMAGE_TOKEN_ID)  # the image's first token: the tokens before it are shared
    a = chat(client, [first], text)
    b = chat(client, [first], text)
    c = chat(client, [other], text)
    prompt_len = a.usage.prompt_tokens
    assert b.usage.prompt_tokens == c.usage.prompt_tokens == prompt_len
    image_end = start + prompt_len - len(ids) + 1  # one past the image's last token
    hit = b.usage.prompt_tokens_details.cached_tokens
    assert hit >= image_end - BLOCK and hit > start  # past the image, to within a block
    assert c.usage.prompt_tokens_details.cached_tokens <= start  # no block of the first image
    _, tokens = want(qwen, [other], text)
    assert [e.bytes for e in c.choices[0].logprobs.content] == token_bytes(tokens)
    # the tiny model's greedy tokens may agree on the two images, its first logprob does not: a
    # hit on the first image's blocks would have given the first image's number
    _, _, lp_a = hf_generate(qwen[1], qwen[2], ids, [as_input(first)], NEW)
    _, _, lp_c = hf_generate(qwen[1], qwen[2], ids, [as_input(other)], NEW)
    got_a, got_c = a.choices[0].logprobs.content[0].logprob, c.choices[0].logprobs.content[0].logprob
    assert got_a == pytest.approx(float(lp_a.max()), abs=ATOL)
    assert got_c == pytest.approx(float(lp_c.max()), abs=ATOL)
    assert abs(got_a - got_c) > 10 * ATOL


def test_loopback_url_refused(clients: Any) -> None:
    client, _ = clients
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=NEW)
    body: Any = err.value.body
    assert body["param"] == "messages[0].content[1]"
    assert "vision.allowed_domains" in body["message"]
    assert chat(client, ONE, "Still there?").usage.completion_tokens == NEW  # still serving
