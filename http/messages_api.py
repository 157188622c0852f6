"""The Anthropic Messages API's routes: POST /v1/messages (a generation through the shared path, with
anthropic/ translating) and POST /v1/messages/count_tokens. Errors on these routes are written in
Anthropic's shape by the middleware (app.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from rillet.http.anthropic.bodies import new_id
from rillet.http.anthropic.events import PING, MessagesFormat, message_body
from rillet.http.anthropic.protocol import count_tokens, parse_messages
from rillet.http.generate import run_generation
from rillet.http.grammar_prep import prepare_grammars
from rillet.http.handlers import STATE, json_response, load_images, off_loop, read_json
from rillet.http.openai.bodies import ChoiceResult
from rillet.http.openai.chunks import Usage
from rillet.http.openai.protocol import GenRequest
from rillet.http.vision.api_parts import MESSAGES


class MessagesFront:
    """The `FrontEnd` (front_end.py) of one Messages request."""

    ping: bytes | None = PING

    def __init__(self, gen: GenRequest, model: str) -> None:
        self.request_id = new_id("msg")
        self._gen = gen
        self._model = model

    def stream_format(self) -> MessagesFormat:
        gen = self._gen
        tools = gen.tools is not None
        return MessagesFormat(self.request_id, self._model, len(gen.prompts[0]), tools, gen.max_tool_calls)

    def body(self, results: list[ChoiceResult], usage: Usage) -> dict[str, Any]:
        gen = self._gen
        tools = gen.tools is not None
        return message_body(self.request_id, self._model, results[0], usage, tools, gen.max_tool_calls)


async def create_message(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    engine = state.ready_engine()
    state.begin()
    try:
        body = await read_json(request)
        images = await load_images(request, body, MESSAGES)
        vlm = engine.vision is not None
        gen = await off_loop(
            request, parse_messages, body, engine.tokenizer, state.limits, images, worker=vlm
        )
        await prepare_grammars(gen, engine, state.cfg.structured.compile_timeout_s)
        return await run_generation(
            request, state, engine, gen, MessagesFront(gen, gen.lora or engine.model_name)
        )
    finally:
        state.end()


async def count_message_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = state.ready_engine()
    body = await read_json(request)
    images = await load_images(request, body, MESSAGES)
    vlm = engine.vision is not None
    n = await off_loop(request, count_tokens, body, engine.tokenizer, state.limits, images, worker=vlm)
    return json_response({"input_tokens": n})
