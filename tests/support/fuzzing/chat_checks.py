"""The checks every 200 answer of /v1/chat/completions, /v1/completions and /v1/embeddings must
pass: a well-formed answer, or an SSE stream that ends as the OpenAI API ends one, with no error
event. Client.check (fuzzing/client.py) applies them, after its own: never a 5xx, every 4xx in
OpenAI's error shape.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import orjson


def check_completion(body: Any, chat: bool, context: str) -> None:
    assert body["object"] == ("chat.completion" if chat else "text_completion"), context
    assert body["choices"], context
    for i, c in enumerate(body["choices"]):
        assert c["index"] == i and c["finish_reason"] in ("stop", "length"), context
        content = c["message"]["content"] if chat else c["text"]
        assert isinstance(content, str), context
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], context


def check_embeddings(body: Any, context: str) -> None:
    assert body["object"] == "list" and body["data"], context
    sizes = set()
    for i, d in enumerate(body["data"]):
        assert d["object"] == "embedding" and d["index"] == i, context
        e = d["embedding"]
        if isinstance(e, str):  # base64 of little-endian float32
            raw = base64.b64decode(e, validate=True)
            assert raw and len(raw) % 4 == 0, context
            sizes.add(len(raw) // 4)
        else:
            assert e and all(isinstance(x, float) and math.isfinite(x) for x in e), context
            sizes.add(len(e))
    assert len(sizes) == 1, context  # one size for every input of a request
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0, context


def check_sse(data: bytes, context: str) -> None:
    blocks = [b for b in data.split(b"\n\n") if b.strip()]
    assert blocks and blocks[-1] == b"data: [DONE]", context
    finished = set()
    for block in blocks[:-1]:
        assert block.startswith(b"data: "), context
        event = orjson.loads(block[6:])
        assert "error" not in event, context
        for c in event["choices"]:
            if c["finish_reason"] is not None:
                assert c["finish_reason"] in ("stop", "length"), context
                finished.add(c["index"])
    assert finished, context
