"""The SSE pump's tests' inputs and readings: `delta()` (a SeqDelta as the engine sends one),
`push()` (what the dispatcher does for one delta in a routing pass of its own), `settle()` (the
pump left to run until it waits again), `chat_format()` (a chat ChunkFormat over the fake
engine's tokenizer) and `contents()` (the content of each content event, per write)."""

from __future__ import annotations

import asyncio

from http_helpers import sse_events
from rillet.core.outputs import SeqDelta
from rillet.core.sequence import FinishReason
from rillet.http.openai.chunks import ChunkFormat
from rillet.http.openai.logprobs import TokenTexts
from rillet.http.stream.request_stream import RequestStream

from http_doubles.byte_tokenizer import FakeTokenizer


def delta(text: str, index: int = 0, finish: FinishReason | None = None, ntok: int | None = None) -> SeqDelta:
    ids = list(range(ntok if ntok is not None else len(text)))
    return SeqDelta("r", index, ids, text, None, finish, 3, 0, 0)


async def settle() -> None:
    """Lets the pump run until it waits again (on the stream, the socket or its gathering wait).
    These scenarios have no I/O: each wake-up is a handful of ready callbacks, so a fixed number
    of loop turns (not a number of ms) is enough whatever the machine's speed or load."""
    for _ in range(20):
        await asyncio.sleep(0)


def push(stream: RequestStream, d: SeqDelta) -> None:
    """What the dispatcher does for one delta in a routing pass of its own."""
    stream.push(d)
    stream.deliver()


def chat_format(n: int = 1) -> ChunkFormat:
    return ChunkFormat(True, "chatcmpl-x", 0, "m", n, False, TokenTexts(FakeTokenizer()))


def contents(writes: list[bytes]) -> list[list[str]]:
    """Per write: the content of each content event in it."""
    out = []
    for w in writes:
        events = [e for e in sse_events(w) if e != "[DONE]"]
        out.append(
            [e["choices"][0]["delta"]["content"] for e in events if "content" in e["choices"][0]["delta"]]
        )
    return out
