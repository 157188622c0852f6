"""Route handlers: the two generation endpoints, embeddings, models, health and metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web
from rillet.http.anthropic.errors import MESSAGES_ROUTES, error_json
from rillet.http.embed import run_embeddings
from rillet.http.engine_api import EngineLike
from rillet.http.generate import run_generation
from rillet.http.grammar_prep import prepare_grammars
from rillet.http.lora.cards import adapter_cards
from rillet.http.metrics.registry import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rillet.http.net.connection import read_body
from rillet.http.openai.chat_messages import Images
from rillet.http.openai.embeddings import parse_embeddings, wrong_task
from rillet.http.openai.errors import JSON_CONTENT_TYPE, ApiError, bad_request, model_not_found
from rillet.http.openai.protocol import GenRequest, check_model, parse_chat, parse_completion
from rillet.http.state import ServerState
from rillet.http.vision.api_parts import CHAT, ImageApi

STATE: web.AppKey[ServerState] = web.AppKey("rillet_state", ServerState)
# Prompts above this are parsed and tokenized off the event loop, so a long prompt does not stall
# the streams being served; small ones are cheaper inline than a thread hop (~0.1 ms). 8 KiB of
# text is ~2 ms of tokenizing here (bench/RESULTS.md): the longest the loop stops for one request.
INLINE_PARSE_BYTES = 8 * 1024

Parser = Callable[..., GenRequest]  # (body, tokenizer, Limits[, images])
T = TypeVar("T")


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type=JSON_CONTENT_TYPE)


async def read_json(request: web.Request) -> dict[str, Any]:
    srv = request.app[STATE].cfg.server
    limit = srv.max_body_bytes
    # A declared length over the limit is refused before reading (or waiting for) any of it.
    if (request.content_length or 0) > limit:
        raise _too_large(limit)
    try:
        shape = error_json if request.path in MESSAGES_ROUTES else None
        raw = await read_body(request, srv.body_timeout_s, shape)
    except web.HTTPRequestEntityTooLarge as exc:
        raise _too_large(limit) from exc
    if not raw:
        raise bad_request("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return body


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is too large (limit: {limit} bytes)", code="request_too_large")


async def _generate(request: web.Request, parser: Parser, api: ImageApi | None = None) -> web.StreamResponse:
    """`api`: where the body keeps images (None: it has none, /v1/completions)."""
    state = request.app[STATE]
    engine = state.ready_engine()
    if "generate" not in engine.tasks:
        raise wrong_task(engine.model_name, "chat or completions", "embeddings")
    state.begin()
    try:
        body = await read_json(request)
        limits = state.limits
        assert limits is not None
        images = () if api is None else (await load_images(request, body, api),)
        vlm = engine.vision is not None
        gen = await off_loop(request, parser, body, engine.tokenizer, limits, *images, worker=vlm)
        await prepare_grammars(gen, engine, state.cfg.structured.compile_timeout_s)
        return await run_generation(request, state, engine, gen)
    finally:
        state.end()


async def load_images(request: web.Request, body: dict[str, Any], api: ImageApi) -> Images:
    """The body's images, fetched and decoded (http/vision/loader.py); a `model` the server does not
    serve is refused first, so nothing is fetched for it."""
    state = request.app[STATE]
    engine = state.ready_engine()
    assert state.limits is not None
    if not api.locate(body):
        return {}
    if body.get("model") is not None:  # (optional on /tokenize; the parsers refuse a missing one)
        check_model(body, state.limits)
    return await state.images.request_images(body, api, engine.vision, engine.model_name)


async def off_loop(
    request: web.Request, fn: Callable[..., T], *args: Any, extra_bytes: int = 0, worker: bool = False
) -> T:
    """`fn(*args)`: parsing and tokenizing a body, inline when the prompt is small, else on a
    worker. `extra_bytes`: prompt text the body does not carry (a stored conversation it continues).
    `worker`: always on a worker (a vision model's prompts, which go through `engine.vision.expand`)."""
    size = request.content_length
    if size is None:  # a chunked body: aiohttp keeps it once read (read_json), so this costs nothing
        size = len(await request.read())
    if size + extra_bytes <= INLINE_PARSE_BYTES and not worker:
        return fn(*args)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, fn, *args)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion)


async def embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = state.ready_engine()
    state.begin()
    try:
        body = await read_json(request)
        limits = state.limits
        assert limits is not None
        check_model(body, limits)  # a model this server does not have is a 404, whatever it serves
        size = engine.embedding_size
        if size is None:
            raise wrong_task(engine.model_name, "embeddings", "chat and completions")
        req = await off_loop(request, parse_embeddings, body, engine.tokenizer, limits, size)
        return await run_embeddings(state, engine, req)
    finally:
        state.end()


def _model_card(state: ServerState, engine: EngineLike) -> dict[str, Any]:
    return {
        "id": engine.model_name,
        "object": "model",
        "created": state.started,
        "owned_by": "rillet",
        "max_model_len": engine.max_model_len,
    }


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = state.ready_engine()
    cards = [_model_card(state, engine), *adapter_cards(state, engine)]
    return json_response({"object": "list", "data": cards})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = state.ready_engine()
    name = request.match_info["model"]
    if name == engine.model_name:
        return json_response(_model_card(state, engine))
    card = next((c for c in adapter_cards(state, engine) if c["id"] == name), None)
    if card is None:
        raise model_not_found(name)
    return json_response(card)


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body: dict[str, Any] = {"status": "ok" if state.phase == "ready" else state.phase}
    if state.engine is not None and state.engine.error:
        body["error"] = state.engine.error
    return json_response(body, 200 if state.phase == "ready" else 503)


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(body=state.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})
