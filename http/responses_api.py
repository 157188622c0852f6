"""The OpenAI Responses API's routes: POST /v1/responses (a generation through the shared path, with
responses/ translating), GET and DELETE /v1/responses/{response_id} (the store)."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from rillet.http.generate import run_generation
from rillet.http.grammar_prep import prepare_grammars
from rillet.http.handlers import STATE, json_response, load_images, off_loop, read_json
from rillet.http.openai.bodies import ChoiceResult
from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import ApiError
from rillet.http.responses.bodies import (
    conversation_after,
    new_id,
    response_object,
    status_of,
    usage_body,
)
from rillet.http.responses.events import ResponsesFormat, answer_output
from rillet.http.responses.input_list import page
from rillet.http.responses.protocol import ResponsesRequest, parse_responses, previous_response_id
from rillet.http.responses.store import ResponseStore
from rillet.http.vision.api_parts import RESPONSES


class ResponsesFront:
    """The `FrontEnd` (front_end.py) of one Responses request; keeps the answer when `store`."""

    ping: bytes | None = None

    def __init__(self, req: ResponsesRequest, model: str, store: ResponseStore | None) -> None:
        self.request_id = new_id("resp")
        self._req = req
        self._model = model
        self._store = store
        self._created = int(time.time())

    def stream_format(self) -> ResponsesFormat:
        req = self._req
        tools = req.gen.tools is not None
        return ResponsesFormat(
            self.request_id, self._created, self._model, req.echo, tools, self._keep, req.gen.max_tool_calls
        )

    def body(self, results: list[ChoiceResult], usage: Usage) -> dict[str, Any]:
        result = results[0]
        output = answer_output(result, self._req.gen.tools is not None, self._req.gen.max_tool_calls)
        status = status_of(output, result.finish_reason)
        response = response_object(
            self.request_id, self._created, self._model, self._req.echo, status, output, usage_body(usage)
        )
        self._keep(response)
        return response

    def _keep(self, response: dict[str, Any]) -> None:
        if self._store is not None:
            messages = conversation_after(self._req.messages, response["output"])
            self._store.put(self.request_id, response, messages, self._req.inputs)


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    engine = state.ready_engine()
    state.begin()
    try:
        body = await read_json(request)
        previous = None
        history = 0
        prev_id = previous_response_id(body)
        if prev_id is not None:
            stored = state.responses.get(prev_id)
            if stored is None:
                raise _not_found(prev_id, "previous_response_id")
            previous, history = stored.messages, stored.size
        images = await load_images(request, body, RESPONSES)
        req = await off_loop(
            request,
            parse_responses,
            body,
            engine.tokenizer,
            state.limits,
            previous,
            images,
            extra_bytes=history,
            worker=engine.vision is not None,
        )
        await prepare_grammars(req.gen, engine, state.cfg.structured.compile_timeout_s)
        front = ResponsesFront(req, req.gen.lora or engine.model_name, state.responses if req.store else None)
        return await run_generation(request, state, engine, req.gen, front)
    finally:
        state.end()


async def get_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    stored = request.app[STATE].responses.get(rid)
    if stored is None:
        raise _not_found(rid, "response_id")
    return json_response(stored.response)


async def list_input_items(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    stored = request.app[STATE].responses.get(rid)
    if stored is None:
        raise _not_found(rid, "response_id")
    return json_response(page(stored.inputs, request.query))


async def delete_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    if not request.app[STATE].responses.delete(rid):
        raise _not_found(rid, "response_id")
    return json_response({"id": rid, "object": "response", "deleted": True})


def _not_found(rid: str, param: str) -> ApiError:
    return ApiError(404, f"No response with id '{rid}' is stored here", param=param, code="not_found")
