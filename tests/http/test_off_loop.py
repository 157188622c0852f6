"""Where a request's parsing runs: inline on the event loop for a small prompt, on a worker thread
for a long one, counting prompt text the body does not carry (a stored conversation it continues),
and on a worker whatever its size for a vision model."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from rillet.http.handlers import INLINE_PARSE_BYTES, off_loop


def _thread_of(
    content_length: int | None, extra_bytes: int = 0, body: bytes = b"", worker: bool = False
) -> bool:
    """True if the parse ran on the event loop's thread."""

    async def read() -> bytes:
        return body

    async def run() -> bool:
        request: Any = SimpleNamespace(content_length=content_length, read=read)
        loop_thread = threading.get_ident()
        ran_on = await off_loop(request, threading.get_ident, extra_bytes=extra_bytes, worker=worker)
        return ran_on == loop_thread

    return asyncio.run(run())


def test_a_small_body_is_parsed_inline() -> None:
    assert _thread_of(200)
    assert _thread_of(INLINE_PARSE_BYTES)
    assert _thread_of(None, body=b"{}")  # chunked: the body's own length decides


def test_a_long_body_is_parsed_on_a_worker() -> None:
    assert not _thread_of(INLINE_PARSE_BYTES + 1)
    assert not _thread_of(None, body=b" " * (INLINE_PARSE_BYTES + 1))


def test_a_short_body_continuing_a_long_conversation_is_parsed_on_a_worker() -> None:
    assert not _thread_of(200, extra_bytes=INLINE_PARSE_BYTES)


def test_a_vision_models_prompt_is_parsed_on_a_worker() -> None:
    """Its parse ends in `engine.vision.expand` (image preprocessing), never on the loop."""
    assert not _thread_of(200, worker=True)
