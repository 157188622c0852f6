"""`rillet serve`: open the socket, load the model behind a progress bar, serve, drain on a signal.

Order matters for operators: the port is bound first (503 "starting" while the model loads, so
health checks see a live process), the engine is built on a daemon thread (a signal during a
long load still ends the process), and SIGTERM/SIGINT drain: new requests get 503, in-flight ones
run to their end within `server.drain_timeout_s`, then the process exits 0. A second signal exits
at once. If the engine thread dies, open requests get their error, and the process exits 1 rather
than linger as a server that can only answer 503 (a supervisor restarts it). A bad model path is a
config error: exit 2 with the message, like any other bad config value.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

from rillet.core.config import ConfigError, RilletConfig
from rillet.http.app import HttpServer
from rillet.http.engine_api import EngineLike
from rillet.http.launch.banner import base_url, ready_banner
from rillet.http.launch.model_path import check_model_path
from rillet.http.launch.process_tuning import raise_fd_limit, tune_for_serving
from rillet.http.launch.progress import ProgressBar
from rillet.http.openai.errors import unavailable
from rillet.http.state import ServerState

log = logging.getLogger("rillet.serve")

EXIT_ENGINE_FAILED = 1
EXIT_CONFIG = 2
# After an engine crash: time for the error events of open requests to reach their clients.
_DEATH_FLUSH_S = 5.0


def _load_engine(cfg: RilletConfig, bar: ProgressBar, release: threading.Event) -> asyncio.Future[Any]:
    """Builds the engine on a daemon thread; the future resolves on the event loop.

    The thread then stays alive until `release` is set (after the engine is shut down): measured
    here, an engine whose building thread has exited decodes ~3-4x slower on CPU (per-thread
    state of torch's CPU thread pool, it seems), while one built by a live thread does not.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def work() -> None:
        try:
            from rillet.core.engine.engine import Engine  # imports torch: only when serving

            engine = Engine(cfg, progress=bar)
        except BaseException as exc:
            loop.call_soon_threadsafe(_settle, fut, None, exc)
            return
        loop.call_soon_threadsafe(_settle, fut, engine, None)
        release.wait()

    threading.Thread(target=work, name="rillet-load", daemon=True).start()
    return fut


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _install_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s: draining (again to exit at once)", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


async def drain(state: ServerState, timeout: float) -> None:
    """Refuse new work, give in-flight requests `timeout` seconds, then cut off the rest."""
    state.phase = "draining"
    if state.inflight:
        log.info("waiting up to %.0fs for %d in-flight requests", timeout, state.inflight)
    try:
        await asyncio.wait_for(state.idle.wait(), timeout)
    except TimeoutError:
        log.warning("drain timeout: stopping %d requests", state.inflight)
        if state.dispatcher is not None:
            state.dispatcher.fail_all(unavailable("draining", "the request did not finish in time"))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.idle.wait(), 2.0)


class StoppedWhileLoading(Exception):
    """A stop signal came while the model was loading. The loading thread is inside torch and
    cannot be stopped, and finalizing the interpreter under it aborts the process (SIGABRT): the
    caller ends the process at once instead (exit code 0, as a stop after the load)."""


async def serve(cfg: RilletConfig) -> int:
    raise_fd_limit()  # before ServerState: the connection cap is sized to the limit
    try:
        check_model_path(cfg)
        state = ServerState(cfg)  # observability.otlp_endpoint without its packages: a ConfigError
    except ConfigError as bad:
        sys.stderr.write(f"rillet: error: {bad}\n")
        return EXIT_CONFIG
    srv = cfg.server
    log.info(
        "connections: at most %d open (%s past it); deadlines: headers %gs, body %gs, idle %gs",
        state.connections.cap,
        "503" if srv.over_capacity == "reply_503" else "reset",
        srv.header_timeout_s,
        srv.body_timeout_s,
        srv.keepalive_timeout_s,
    )
    server = HttpServer(state)
    port = await server.start(cfg.server.host, cfg.server.port)
    log.info("listening on %s (503 until the model is loaded)", base_url(cfg.server.host, port))
    stop = asyncio.Event()
    _install_signals(stop)
    bar = ProgressBar(sys.stderr)
    release = threading.Event()
    loading = _load_engine(cfg, bar, release)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([loading, stopping], return_when=asyncio.FIRST_COMPLETED)
    bar.close()
    if not loading.done():
        log.info("stopped while loading")
        await server.stop()
        raise StoppedWhileLoading()
    exc = loading.exception()
    if exc is not None:
        await server.stop()
        if isinstance(exc, ConfigError):  # e.g. model.path missing or of the wrong kind
            sys.stderr.write(f"rillet: error: {exc}\n")
            return EXIT_CONFIG
        log.error("could not load the model: %s: %s", type(exc).__name__, exc)
        return EXIT_ENGINE_FAILED
    engine: EngineLike = loading.result()
    tune_for_serving(cfg.server.loop_nice)
    engine.start()
    state.attach(engine)
    blocks = engine.stats().kv_blocks_total
    log.info("%s", ready_banner(cfg, engine.model_name, engine.max_model_len, blocks, cfg.server.host, port))
    died = asyncio.ensure_future(state.died.wait())
    await asyncio.wait([stopping, died], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if state.died.is_set():
        log.error("exiting: the engine thread died (%s)", engine.error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.idle.wait(), _DEATH_FLUSH_S)
        code = EXIT_ENGINE_FAILED
    else:
        died.cancel()
        await drain(state, cfg.server.drain_timeout_s)
        if state.died.is_set():  # died while draining
            code = EXIT_ENGINE_FAILED
    await server.stop()
    engine.shutdown()
    release.set()
    log.info("stopped")
    return code
