"""Issue 70's must-show for Gemma 3, end to end: a tiny Gemma 3 folder saved by transformers
(tiny_models/gemma3_vlm.py: SigLIP tower, projector, sliding windows, images attended
bidirectionally), served by a real rillet server, answers an image sent through the `openai` SDK
(chat, streamed and not; Responses) and the `anthropic` SDK with transformers' greedy tokens, and
`usage` counts the image's tokens. Eager decode (graphs.enabled=off): compiling would dominate."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import openai
import pytest
import torch
from http_doubles.images import b64, data_url
from http_helpers import sdk_clients
from PIL import Image

NEW = 6
MODEL = "gemma3-vlm-tiny"
TEXT = "What is in the picture?"


@pytest.fixture(scope="module")
def png() -> bytes:
    arr = np.random.default_rng(5).integers(0, 256, (30, 44, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def want(tiny_gemma3_vlm: tuple[Path, Any], png: bytes) -> tuple[int, str]:
    """transformers' (prompt length, greedy text) for one user turn: the image, then TEXT."""
    import transformers

    folder, model = tiny_gemma3_vlm
    proc = transformers.AutoProcessor.from_pretrained(folder)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": TEXT}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    enc = proc(text=text, images=[Image.open(io.BytesIO(png)).convert("RGB")], return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    tokens = out[0, enc["input_ids"].shape[1] :].tolist()
    return int(enc["input_ids"].shape[1]), str(proc.tokenizer.decode(tokens, skip_special_tokens=True))


@pytest.fixture(scope="module")
def clients(tiny_gemma3_vlm: tuple[Path, Any]) -> Iterator[tuple[openai.OpenAI, anthropic.Anthropic]]:
    folder, _ = tiny_gemma3_vlm
    overrides = [f"model.path={folder}", f"model.served_name={MODEL}", "model.dtype=float32"]
    with sdk_clients([*overrides, "graphs.enabled=off"]) as both:
        yield both


def test_openai_chat_and_stream_match_transformers(clients: Any, png: bytes, want: tuple[int, str]) -> None:
    client, _ = clients
    prompt_len, text = want
    content = [{"type": "image_url", "image_url": {"url": data_url(png)}}, {"type": "text", "text": TEXT}]
    kw: Any = {"model": MODEL, "max_tokens": NEW, "temperature": 0, "extra_body": {"ignore_eos": True}}
    messages: Any = [{"role": "user", "content": content}]
    full = client.chat.completions.create(messages=messages, **kw)
    assert full.choices[0].message.content == text
    assert full.usage.prompt_tokens == prompt_len and full.usage.completion_tokens == NEW
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_anthropic_and_responses_match_transformers(clients: Any, png: bytes, want: tuple[int, str]) -> None:
    client, claude = clients
    prompt_len, text = want
    source = {"type": "base64", "media_type": "image/png", "data": b64(png)}
    content: Any = [{"type": "image", "source": source}, {"type": "text", "text": TEXT}]
    m = claude.messages.create(
        model=MODEL,
        max_tokens=NEW,
        messages=[{"role": "user", "content": content}],
        extra_body={"ignore_eos": True, "temperature": 0},  # this SDK's create() has no temperature
    )
    assert "".join(b.text for b in m.content if b.type == "text") == text
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == prompt_len
    parts: Any = [{"type": "input_image", "image_url": data_url(png)}, {"type": "input_text", "text": TEXT}]
    r = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": parts}],
        max_output_tokens=NEW,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.output_text == text
    assert r.usage is not None and r.usage.input_tokens == prompt_len


def test_the_reference_answer_is_text(want: tuple[int, str]) -> None:
    """Guards the comparisons above from passing on an empty answer (all special tokens)."""
    assert want[1].strip()
