"""One /v1/embeddings request from parsed body to answer: one engine request per input, collected.

Each input is its own engine sequence, all queued as one (`Engine.add_embeddings`: all or none,
taken by one step), so a batch of inputs is scheduled like any prompts, beside the chat streams,
within the step's token budget; each finishes with one delta carrying its vector, routed by the
dispatcher to this request's stream like a non-streamed completion's. Whatever way the handler
ends, `finally` unregisters the inputs and aborts those still in the engine (their KV blocks come
back within a step).
"""

from __future__ import annotations

import time
import uuid

from aiohttp import web
from rillet.core.engine.inbox import NewEmbedding
from rillet.http.engine_api import EngineLike
from rillet.http.openai.embeddings import EmbedRequest, embeddings_body
from rillet.http.openai.errors import JSON_CONTENT_TYPE, engine_refusal
from rillet.http.state import ServerState
from rillet.http.stream.collect import collect_vectors
from rillet.http.stream.request_stream import RequestStream


async def run_embeddings(state: ServerState, engine: EngineLike, req: EmbedRequest) -> web.Response:
    rid = "embd-" + uuid.uuid4().hex
    engine_ids = tuple(f"{rid}-{i}" for i in range(len(req.inputs)))
    stream = RequestStream(rid, len(req.inputs), engine_ids)
    _submit(state, engine, req, stream)
    state.metrics.prompt_tokens.inc(req.prompt_tokens)
    clean = False
    try:
        vectors = await collect_vectors(stream)
        clean = True
    finally:
        disp = state.dispatcher
        for eid in engine_ids:
            if disp is not None:
                disp.unregister(eid)
            if not (clean and stream.done_in_engine):
                engine.abort(eid)
    body = embeddings_body(engine.model_name, vectors, req.base64, req.prompt_tokens)
    return web.Response(body=body, content_type=JSON_CONTENT_TYPE)


def _submit(state: ServerState, engine: EngineLike, req: EmbedRequest, stream: RequestStream) -> None:
    """Registers and adds every input; all or nothing."""
    disp = state.dispatcher
    assert disp is not None
    timeout = state.cfg.server.request_timeout_s
    deadline = time.monotonic() + timeout if timeout is not None else None
    inputs = []
    for i, (eid, ids) in enumerate(zip(stream.engine_ids, req.inputs, strict=True)):
        disp.register(eid, stream, i)
        inputs.append(NewEmbedding(eid, ids, req.dimensions, deadline))
    try:
        engine.add_embeddings(inputs)
    except Exception as exc:
        for eid in stream.engine_ids:
            disp.unregister(eid)
        refusal = engine_refusal(exc)
        if refusal is None:
            raise
        raise refusal from exc
