"""The listening socket: aiohttp's TCPSite, except that each accepted connection is built by our
factory (connection.py's `ApiRequestHandler`) instead of aiohttp's plain `RequestHandler`.

`BaseSite` is aiohttp's documented extension point for sites; `start` does what TCPSite.start does
with another protocol factory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

# Pending connections the kernel queues before accept(); a burst of thousands of connects (a
# flood, or many clients starting at once) overflows aiohttp's default of 128, and each dropped
# SYN costs its client a one-second retransmit. Same as uvicorn's default; the kernel caps it at
# net.core.somaxconn.
BACKLOG = 2048


class ApiSite(web.BaseSite):
    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        make_protocol: Callable[[], asyncio.Protocol],
    ) -> None:
        super().__init__(runner, backlog=BACKLOG)
        self._host = host
        self._port = port
        self._make_protocol = make_protocol

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._make_protocol, self._host, self._port, backlog=self._backlog, reuse_address=True
        )
