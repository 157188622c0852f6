"""One generation request from parsed body to answer: submit to the engine, then stream or collect.

Streaming and non-streaming share everything up to the consumer: the same RequestStream fed by
the dispatcher; SSE writes it out as it comes (sse.py), non-streaming gathers it (collect.py).
Whatever way the handler ends (done, error, client gone, cancelled), `finally` unregisters the
request and aborts it in the engine if it is still running, which frees its KV blocks within a step.
"""

from __future__ import annotations

import logging
import time
import uuid

import orjson
from aiohttp import web

from .chunks import ChunkFormat, Usage
from .collect import chat_body, collect, completion_body
from .engine_api import EngineLike
from .errors import JSON_CONTENT_TYPE, bad_request, queue_full, unavailable
from .protocol import GenRequest
from .sse import pump_sse
from .state import ServerState
from .stream_state import RequestStream

log = logging.getLogger(__name__)

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # tell proxies (nginx) not to buffer the stream
}


async def run_generation(
    request: web.Request, state: ServerState, engine: EngineLike, gen: GenRequest
) -> web.StreamResponse:
    chat = gen.kind == "chat"
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    engine_ids = (rid,) if len(gen.prompts) == 1 else tuple(f"{rid}-{p}" for p in range(len(gen.prompts)))
    stream = RequestStream(rid, gen.num_choices, engine_ids)
    usage = Usage([len(p) for p in gen.prompts], gen.n)
    _submit(state, engine, gen, stream)
    state.metrics.prompt_tokens.inc(usage.prompt_tokens)
    clean = False
    try:
        if gen.stream:
            resp, clean = await _stream(request, state, engine, gen, stream, usage)
            return resp
        results = await collect(stream, usage, gen.logprobs is not None)
        clean = True
        created, model, texts = int(time.time()), engine.model_name, state.texts
        assert texts is not None
        if chat:
            body = chat_body(rid, created, model, results, usage, texts)
        else:
            body = completion_body(rid, created, model, results, usage, texts, gen.echo_texts)
        return web.Response(body=orjson.dumps(body), content_type=JSON_CONTENT_TYPE)
    finally:
        disp = state.dispatcher
        for eid in engine_ids:
            if disp is not None:
                disp.unregister(eid)
            if not (clean and stream.done_in_engine):
                engine.abort(eid)
        if stream.first_token_at is not None:
            state.metrics.e2e.observe(stream.last_token_at - stream.arrival)


async def _stream(
    request: web.Request,
    state: ServerState,
    engine: EngineLike,
    gen: GenRequest,
    stream: RequestStream,
    usage: Usage,
) -> tuple[web.StreamResponse, bool]:
    """Returns (response, True if the request ran to its end)."""
    assert state.texts is not None
    fmt = ChunkFormat(
        gen.kind == "chat",
        stream.request_id,
        int(time.time()),
        engine.model_name,
        gen.num_choices,
        gen.include_usage,
        state.texts,
    )
    head = fmt.role() if gen.kind == "chat" else fmt.echo(gen.echo_texts, gen.n) if gen.echo_texts else b""
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    try:
        await resp.prepare(request)
        ok = await pump_sse(stream, fmt, usage, resp.write, state.cfg.stream, head)
        await resp.write_eof()
    except ConnectionResetError:  # the client went away mid-stream (aiohttp raises a subclass)
        log.debug("client of %s disconnected mid-stream", stream.request_id)
        return resp, False
    return resp, ok


def _submit(state: ServerState, engine: EngineLike, gen: GenRequest, stream: RequestStream) -> None:
    """Registers every prompt's engine request, then adds it; all or nothing."""
    disp = state.dispatcher
    assert disp is not None
    timeout = state.cfg.server.request_timeout_s
    deadline = time.monotonic() + timeout if timeout is not None else None
    added: list[str] = []
    try:
        for p, (ids, params) in enumerate(zip(gen.prompts, gen.params, strict=True)):
            eid = stream.engine_ids[p]
            disp.register(eid, stream, p * gen.n)
            engine.add_request(eid, ids, params, n=gen.n, deadline=deadline)
            added.append(eid)
    except Exception as exc:
        for eid in stream.engine_ids:
            disp.unregister(eid)
        for eid in added:
            engine.abort(eid)
        raise _submit_error(state, exc) from exc


def _submit_error(state: ServerState, exc: Exception) -> Exception:
    if isinstance(exc, state.queue_full_error):
        return queue_full(str(exc))
    if isinstance(exc, state.engine_dead_error):
        return unavailable("dead", str(exc))
    if isinstance(exc, ValueError):  # the engine's own input checks: "field: message"
        field, _, message = str(exc).partition(": ")
        return bad_request(str(exc) if not message else f"'{field}' {message}", param=field or None)
    return exc  # unexpected: the middleware logs it and answers 500
