"""The aiohttp application: routes, the one middleware (auth, errors, request metrics), the runner.

`HttpServer` opens the socket with a `ServerState` that may not have an engine yet (503 until
`state.attach(engine)`); `rillet serve` (serve.py) and the tests both drive it. Each accepted
connection is a connection.py `ApiRequestHandler` (read deadlines, the connection cap, parser
errors in the API's shape), made by listener.py's site.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from rillet.http.anthropic.errors import MESSAGES_ROUTES, error_json
from rillet.http.handlers import STATE, chat_completions, completions, get_model, health, list_models, metrics
from rillet.http.handlers import embeddings as embeddings_handler
from rillet.http.lora.routes import load_lora_adapter, unload_lora_adapter
from rillet.http.messages_api import count_message_tokens, create_message
from rillet.http.net.connection import ApiRequestHandler, connection_of
from rillet.http.net.listener import ApiSite
from rillet.http.net.responses import error_response
from rillet.http.openai.errors import ApiError, from_http_status, headers_too_large, internal_error
from rillet.http.responses_api import create_response, delete_response, get_response, list_input_items
from rillet.http.state import ServerState
from rillet.http.tokenize.routes import detokenize_handler, tokenize_handler
from rillet.http.ui.routes import add_ui_routes
from rillet.http.worker.routes import add_worker_routes

log = logging.getLogger(__name__)


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    resource = request.match_info.route.resource
    endpoint = resource.canonical if resource is not None else "unmatched"
    status = 500
    conn = connection_of(request)
    try:
        if conn is not None:
            conn.request_started(request)  # the headers are in: their deadline ends
        _check_header_size(request, state.cfg.server.max_header_bytes)
        if (preflight := state.cors.preflight(request)) is not None:
            status = preflight.status
            return preflight
        state.keys.check(endpoint, request.headers.get("Authorization"), request.headers.get("x-api-key"))
        resp = await handler(request)
        status = resp.status
        return resp
    except ApiError as exc:
        status = exc.status
        return _error(exc, endpoint)
    except web.HTTPException as exc:  # routing (404/405) and aiohttp's own checks
        allow = exc.headers.get("Allow")
        mapped = from_http_status(exc.status, exc.reason, request.method, request.path, allow)
        status = mapped.status
        return _error(mapped, request.path if resource is None else endpoint)  # 405: no resource
    except (asyncio.CancelledError, ConnectionResetError):
        status = 499  # client closed the request (nginx's convention), for the metrics only
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(internal_error(), endpoint)
    finally:
        if conn is not None:
            conn.request_finished()
        state.metrics.requests.labels(endpoint, str(status)).inc()


def _error(err: ApiError, endpoint: str) -> web.Response:
    """In the shape of the API the route belongs to: Anthropic's on /v1/messages, else OpenAI's."""
    return error_response(err, error_json(err) if endpoint in MESSAGES_ROUTES else None)


def _check_header_size(request: web.Request, limit: int) -> None:
    """`server.max_header_bytes` bounds all headers together; aiohttp's parser bounds each line."""
    size = sum(len(k) + len(v) + 4 for k, v in request.raw_headers)  # "k: v\r\n"
    if size > limit:
        raise headers_too_large(size, limit)


class _ProtocolLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp logs each malformed request (header too long, bad request line) at ERROR with a
    traceback: a log flood any client can cause. Those are the client's fault, logged as one line at
    DEBUG; anything else keeps its traceback."""

    def exception(self, msg: object, *args: object, exc_info: object = True, **kwargs: object) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self.logger.debug("%s: %s", str(msg) % args if args else msg, exc_info)
        else:
            self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)  # type: ignore[arg-type]


def build_app(state: ServerState) -> web.Application:
    app = web.Application(client_max_size=state.cfg.server.max_body_bytes, middlewares=[api_middleware])
    app[STATE] = state
    if state.cors.enabled:
        app.on_response_prepare.append(state.cors.on_prepare)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_post("/v1/messages", create_message)
    app.router.add_post("/v1/messages/count_tokens", count_message_tokens)
    app.router.add_post("/v1/embeddings", embeddings_handler)
    app.router.add_post("/tokenize", tokenize_handler)
    app.router.add_post("/detokenize", detokenize_handler)
    if state.cfg.lora.allow_runtime_updates:  # vLLM's routes; absent otherwise (404)
        app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)  # ids may hold / (org/name)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    add_worker_routes(app)  # the routers' worker API (docs/worker-api.md)
    if state.cfg.server.ui == "on":
        add_ui_routes(app)
    return app


class HttpServer:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.app = build_app(state)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listens on host:port (0 = any free port); returns the port."""
        srv = self.state.cfg.server
        access_log = logging.getLogger("aiohttp.access") if log.isEnabledFor(logging.DEBUG) else None
        handler_kwargs: dict[str, Any] = {
            "access_log": access_log,
            "max_line_size": srv.max_header_bytes,
            "max_field_size": srv.max_header_bytes,
            "logger": _ProtocolLog(logging.getLogger("aiohttp.server"), {}),
            # aiohttp's own idle timer, a backstop only: connection.py's deadlines come first.
            "keepalive_timeout": 2 * max(srv.keepalive_timeout_s, srv.header_timeout_s) + 10,
        }
        runner = web.AppRunner(
            self.app,
            # A client that disconnects cancels its handler, whose `finally` aborts the request in
            # the engine: non-streaming requests notice a vanished client too, not only streams.
            handler_cancellation=True,
            shutdown_timeout=1.0,
            **handler_kwargs,
        )
        self._runner = runner
        await runner.setup()
        loop = asyncio.get_running_loop()
        limits = self.state.connections
        manager = runner.server

        def make_protocol() -> ApiRequestHandler:
            return ApiRequestHandler(manager, loop=loop, limits=limits, **handler_kwargs)

        site = ApiSite(runner, host, port, make_protocol)
        await site.start()
        ports = self._bound_ports()
        self.port = ports[0] if ports else port
        return self.port

    def _bound_ports(self) -> list[int]:
        assert self._runner is not None
        ports = []
        for addr in self._runner.addresses:
            if isinstance(addr, tuple) and len(addr) >= 2:
                ports.append(int(addr[1]))
        return ports

    async def stop(self) -> None:
        await self.state.detach()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.state.stop_tracing()  # after the handlers: the cancelled ones' spans too
