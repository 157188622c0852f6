"""A server on its own thread and event loop, for tests, notebooks and embedding.

The caller owns the engine (start/shutdown); this owns only the loop, the socket and the state.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from rillet.core.config import RilletConfig
from rillet.http.app import HttpServer
from rillet.http.engine_api import EngineLike
from rillet.http.state import ServerState

T = TypeVar("T")


class BackgroundServer:
    def __init__(self, cfg: RilletConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.cfg = cfg
        self.host = host
        self._port = port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rillet-http", daemon=True)
        self.state = ServerState(cfg)
        self.server: HttpServer | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """The OpenAI client's base_url."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, engine: EngineLike | None = None) -> BackgroundServer:
        self._thread.start()
        self.server = HttpServer(self.state)
        self.port = self.call(self.server.start(self.host, self._port))
        if engine is not None:
            self.attach(engine)
        return self

    def attach(self, engine: EngineLike) -> None:
        async def attach() -> None:
            self.state.attach(engine)

        self.call(attach())

    def stop(self) -> None:
        if self.server is not None:
            self.call(self.server.stop())
            self.server = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
