"""What a generation request's API adds to the shared path: its ids, stream format and bodies.

generate.py runs every generation the same way (submit, stream through sse.py or collect); a
`FrontEnd` is the per-request part that differs between APIs: the response id, the stream's event
format (stream/event_format.py), the non-streaming body, and an optional keep-alive event. OpenAI
chat and completions are `OpenAiFront`; the Responses and Anthropic Messages front ends live beside
their handlers (responses_api.py, messages_api.py).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from rillet.http.openai.bodies import ChoiceResult, chat_body, completion_body
from rillet.http.openai.chunks import ChunkFormat, Usage
from rillet.http.openai.logprobs import TokenTexts
from rillet.http.openai.protocol import GenRequest
from rillet.http.stream.event_format import EventFormat


class FrontEnd(Protocol):
    request_id: str

    @property
    def ping(self) -> bytes | None:
        """Sent while a stream has had no output for stream.ping_interval_s (None: no keep-alive)."""
        ...

    def stream_format(self) -> EventFormat: ...

    def body(self, results: list[ChoiceResult], usage: Usage) -> Any:
        """The non-streaming answer (JSON-serialisable) once every choice has ended."""
        ...


class OpenAiFront:
    ping: bytes | None = None

    def __init__(self, gen: GenRequest, model: str, texts: TokenTexts) -> None:
        chat = gen.kind == "chat"
        self.request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self._gen = gen
        self._model = model
        self._texts = texts
        self._created = int(time.time())

    def stream_format(self) -> ChunkFormat:
        gen = self._gen
        return ChunkFormat(
            gen.kind == "chat",
            self.request_id,
            self._created,
            self._model,
            gen.num_choices,
            gen.include_usage,
            self._texts,
            tools=gen.tools is not None,
            max_tool_calls=gen.max_tool_calls,
            echo_texts=gen.echo_texts,
            n=gen.n,
        )

    def body(self, results: list[ChoiceResult], usage: Usage) -> dict[str, Any]:
        gen, rid, created, model = self._gen, self.request_id, self._created, self._model
        if gen.kind == "chat":
            tools = gen.tools is not None
            return chat_body(rid, created, model, results, usage, self._texts, tools, gen.max_tool_calls)
        prompts = gen.prompts if gen.echo_texts is not None and gen.logprobs is not None else None
        return completion_body(rid, created, model, results, usage, self._texts, gen.echo_texts, prompts)
