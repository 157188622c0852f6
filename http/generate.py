"""One generation request from parsed body to answer: submit to the engine, then stream or collect.

Streaming and non-streaming share everything up to the consumer: the same RequestStream fed by
the dispatcher; SSE writes it out as it comes (sse.py), non-streaming gathers it (collect.py).
Whatever way the handler ends (done, error, client gone, cancelled), `finally` unregisters the
request and aborts it in the engine if it is still running, which frees its KV blocks within a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

import orjson
from aiohttp import web
from rillet.core.engine.inbox import NewRequest
from rillet.http.engine_api import EngineLike
from rillet.http.front_end import FrontEnd, OpenAiFront
from rillet.http.keepalive import keep_alive
from rillet.http.observability.facts import Outcome, outcome_of, request_facts
from rillet.http.openai.chunks import Usage
from rillet.http.openai.errors import JSON_CONTENT_TYPE, ApiError, engine_refusal
from rillet.http.openai.protocol import GenRequest
from rillet.http.state import ServerState
from rillet.http.stream.collect import collect
from rillet.http.stream.request_stream import RequestStream
from rillet.http.stream.sse import pump_sse
from rillet.http.stream.sse_response import SseResponse, start_sse
from rillet.http.stream.transport_write import transport_write

log = logging.getLogger(__name__)

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # tell proxies (nginx) not to buffer the stream
}
# Kernel send buffer of a streaming connection (Linux doubles it). Left to autotuning, loopback
# grows it to megabytes, so a client that stops reading would park thousands of tokens in the
# kernel before back-pressure reached `stream.max_buffered_tokens`. 64 KiB still carries ~3,000
# tokens/s per stream at 100 ms round trip.
STREAM_SNDBUF_BYTES = 32 * 1024
# After a request is cut off for a slow reader, its error event gets this long to go out; a client
# that still reads nothing then loses the connection, so its handler cannot hang.
CUT_OFF_GRACE_S = 2.0


async def run_generation(
    request: web.Request,
    state: ServerState,
    engine: EngineLike,
    gen: GenRequest,
    front: FrontEnd | None = None,
) -> web.StreamResponse:
    """`front`: the API answering (None: OpenAI chat or completions, from `gen.kind`)."""
    assert state.texts is not None
    api: FrontEnd = front or OpenAiFront(gen, gen.lora or engine.model_name, state.texts)
    rid = api.request_id
    engine_ids = (rid,) if len(gen.prompts) == 1 else tuple(f"{rid}-{p}" for p in range(len(gen.prompts)))
    stream = RequestStream(rid, gen.num_choices, engine_ids)
    usage = Usage([len(p) for p in gen.prompts], gen.n)
    try:
        _submit(state, engine, gen, stream)
    except ApiError as refused:  # queue full, engine dead, a request the engine will not take
        if state.tracing is not None:
            _trace(request, state, engine, gen, stream, usage, outcome_of(refused, False, stream))
        raise
    state.metrics.prompt_tokens.inc(usage.prompt_tokens)
    if gen.lora is not None:
        state.metrics.count_adapter(gen.lora, usage.prompt_tokens)
    clean = False
    error: BaseException | None = None
    try:
        if gen.stream:
            resp, clean = await _stream(request, state, stream, usage, api)
            return resp
        results = await collect(stream, usage, gen.logprobs is not None)
        clean = True
        body = api.body(results, usage)
        return web.Response(body=orjson.dumps(body), content_type=JSON_CONTENT_TYPE)
    except BaseException as exc:  # for the request's span: why it ended
        error = exc
        raise
    finally:
        disp = state.dispatcher
        for eid in engine_ids:
            if disp is not None:
                disp.unregister(eid)
            if not (clean and stream.done_in_engine):
                engine.abort(eid)
        if stream.first_token_at is not None:
            state.metrics.e2e.observe(stream.last_token_at - stream.arrival)
        if gen.lora is not None:
            state.metrics.adapter_tokens(gen.lora, usage.completion_tokens)
        if state.tracing is not None:
            _trace(request, state, engine, gen, stream, usage, outcome_of(error, clean, stream))


def _trace(
    request: web.Request,
    state: ServerState,
    engine: EngineLike,
    gen: GenRequest,
    stream: RequestStream,
    usage: Usage,
    outcome: Outcome,
) -> None:
    """The request's span (observability.otlp_endpoint), queued for export."""
    assert state.tracing is not None
    model = gen.lora or engine.model_name
    facts = request_facts(request.method, request.path, gen, model, stream.request_id, stream, usage, outcome)
    state.tracing.record(request.headers, facts)


async def _stream(
    request: web.Request,
    state: ServerState,
    stream: RequestStream,
    usage: Usage,
    front: FrontEnd,
) -> tuple[web.StreamResponse, bool]:
    """Returns (response, True if the request ran to its end)."""
    fmt = front.stream_format()
    resp = SseResponse(status=200, headers=SSE_HEADERS)
    _bound_send_buffer(request)
    timer: list[asyncio.TimerHandle] = []
    stream.on_cut = lambda: _close_after_grace(request, resp, timer)
    cfg = state.cfg.stream
    try:
        # Requests that arrived with this one reach the engine before any of them spends the loop's
        # time on headers and a head event, so a burst of streamed requests starts in as few engine
        # steps as a non-streamed one (null engine, 256 streams at once: the last one began ~30 ms,
        # five steps, later without this). No first token waits: the dispatcher's next pass comes
        # after the handlers resumed here.
        await asyncio.sleep(0)
        head = fmt.head()
        writer = await start_sse(resp, request, head)  # the headers leave with the head
        direct = transport_write(writer)
        with keep_alive(stream, direct, front.ping, cfg.ping_interval_s):
            ok = await pump_sse(stream, fmt, usage, resp.write, cfg, head, direct, resp.write_eof)
        await resp.write_eof()  # after a failure's error event (else already sent: a no-op)
    except ConnectionResetError:  # the client went away mid-stream (aiohttp raises a subclass)
        log.debug("client of %s disconnected mid-stream", stream.request_id)
        return resp, False
    finally:
        stream.on_cut = None
        for handle in timer:  # the error event went out in time: the connection is not ours to kill
            handle.cancel()
    return resp, ok


def _bound_send_buffer(request: web.Request) -> None:
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF_BYTES)


def _close_after_grace(
    request: web.Request, resp: web.StreamResponse, timer: list[asyncio.TimerHandle]
) -> None:
    """The request was cut off: no keep-alive after it, and drop the connection if it stays stuck."""
    resp.force_close()
    transport = request.transport
    if transport is not None and not timer:
        timer.append(asyncio.get_running_loop().call_later(CUT_OFF_GRACE_S, transport.abort))


def _submit(state: ServerState, engine: EngineLike, gen: GenRequest, stream: RequestStream) -> None:
    """Registers every prompt's engine request, then adds them as one (the engine schedules them
    from the same step); all or nothing."""
    disp = state.dispatcher
    assert disp is not None
    timeout = state.cfg.server.request_timeout_s
    deadline = time.monotonic() + timeout if timeout is not None else None
    requests = []
    for p, (ids, params) in enumerate(zip(gen.prompts, gen.params, strict=True)):
        eid = stream.engine_ids[p]
        disp.register(eid, stream, p * gen.n)
        requests.append(NewRequest(eid, ids, params, gen.n, deadline, gen.lora, gen.priority, gen.mm))
    try:
        engine.add_requests(requests)
    except Exception as exc:
        for eid in stream.engine_ids:
            disp.unregister(eid)
        refusal = engine_refusal(exc)
        if refusal is None:
            raise
        raise refusal from exc
