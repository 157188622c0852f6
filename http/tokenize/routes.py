"""The /tokenize and /detokenize route handlers (protocol.py holds the bodies). Behind the API key
like every route but /health; large bodies are tokenized off the event loop, as generations are."""

from __future__ import annotations

from aiohttp import web
from rillet.http.handlers import STATE, json_response, load_images, off_loop, read_json
from rillet.http.tokenize.protocol import detokenize, tokenize
from rillet.http.vision.api_parts import CHAT


async def tokenize_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = state.ready_engine()
    body = await read_json(request)
    images = await load_images(request, body, CHAT)  # `messages` may hold images, as chat's
    vlm = engine.vision is not None
    ids = await off_loop(request, tokenize, body, engine.tokenizer, state.limits, images, worker=vlm)
    return json_response(ids)


async def detokenize_handler(request: web.Request) -> web.Response:
    state = request.app[STATE]
    engine = state.ready_engine()
    body = await read_json(request)
    return json_response(await off_loop(request, detokenize, body, engine.tokenizer, state.limits))
