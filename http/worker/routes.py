"""The routers' worker API (docs/worker-api.md): SGLang's /server_info, /model_info, /get_load
and /flush_cache, which sglang-router / smg and vllm-router call on each worker. Behind the API key
like every route but /health (server.api_keys); the routers send theirs as `Authorization: Bearer`."""

from __future__ import annotations

import asyncio
from typing import cast

from aiohttp import web
from rillet.core.errors import EngineDeadError
from rillet.http.engine_api import WorkerEngine
from rillet.http.handlers import STATE, json_response
from rillet.http.openai.errors import ApiError, unavailable
from rillet.http.worker import facts

# A flush waits for the engine's current step to end; past this the engine is stuck (a compile, a
# hung device), and the caller hears so rather than waiting on.
FLUSH_TIMEOUT_S = 30.0


async def server_info(request: web.Request) -> web.Response:
    engine = request.app[STATE].ready_engine()
    return json_response(facts.server_info(engine, cast(WorkerEngine, engine), engine.stats()))


async def model_info(request: web.Request) -> web.Response:
    engine = request.app[STATE].ready_engine()
    return json_response(facts.model_info(engine, cast(WorkerEngine, engine)))


async def get_load(request: web.Request) -> web.Response:
    engine = request.app[STATE].ready_engine()
    return json_response(facts.load(engine.stats(), engine.cfg.cache.block_size))


async def flush_cache(request: web.Request) -> web.Response:
    """Empties the prefix cache of every block no running request holds (a body, if any, is
    ignored: the routers send none). Running and waiting requests go on untouched; the blocks they
    hold keep their keys and are cached again when released (`kept_blocks`)."""
    engine = cast(WorkerEngine, request.app[STATE].ready_engine())
    try:
        future = engine.flush_prefix_cache()
        done = await asyncio.wait_for(asyncio.wrap_future(future), FLUSH_TIMEOUT_S)
    except (EngineDeadError, RuntimeError) as exc:
        raise unavailable("dead", str(exc)) from exc
    except TimeoutError as exc:
        raise ApiError(
            503, f"The engine did not take the flush within {FLUSH_TIMEOUT_S:g} s", code="engine_busy"
        ) from exc
    return json_response(
        {"message": "Cache flushed.", "flushed_blocks": done.flushed_blocks, "kept_blocks": done.kept_blocks}
    )


def add_worker_routes(app: web.Application) -> None:
    for path, handler in (
        ("/server_info", server_info),
        ("/get_server_info", server_info),  # the name older routers (sgl-router, vllm-router) call
        ("/model_info", model_info),
        ("/get_model_info", model_info),
        ("/get_load", get_load),
    ):
        app.router.add_get(path, handler)
    app.router.add_post("/flush_cache", flush_cache)
    app.router.add_get("/flush_cache", flush_cache)  # SGLang serves both methods
