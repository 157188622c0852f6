"""Cross-origin requests from browsers (`server.cors_allowed_origins`), as vLLM and llama.cpp's
server answer them. Off by default: the server listens on localhost, and "*" would let any web page
the user opens call it.

With origins configured, a request whose `Origin` is allowed gets `Access-Control-Allow-Origin`
(the origin itself, with `Vary: Origin`; `*` where every origin is), streams included, since the
header is added as any response is prepared. A preflight (`OPTIONS` with
`Access-Control-Request-Method`) is answered 204 before the API key check (browsers send no
credentials with it); one from an origin not allowed gets a 403. Credentials are API keys in
headers, never cookies, so `Access-Control-Allow-Credentials` is not sent.
"""

from __future__ import annotations

from aiohttp import web
from rillet.http.openai.errors import ApiError

METHODS = "GET, POST, DELETE, OPTIONS"
MAX_AGE_S = 600  # browsers cache a preflight's answer this long
EXPOSED = "Retry-After"  # what a 429 / 503 tells a client to wait


class Cors:
    def __init__(self, origins: tuple[str, ...]) -> None:
        self._any = "*" in origins
        self._origins = frozenset(o.rstrip("/") for o in origins)

    @property
    def enabled(self) -> bool:
        return bool(self._origins)

    def allow(self, origin: str | None) -> str | None:
        """The `Access-Control-Allow-Origin` value for a request from `origin`; None: none."""
        if not origin or not self._origins:
            return None
        if self._any:
            return "*"
        return origin if origin.rstrip("/") in self._origins else None

    def preflight(self, request: web.Request) -> web.Response | None:
        """The answer to a CORS preflight; None for any other request."""
        if not self._origins or request.method != "OPTIONS":
            return None
        if "Access-Control-Request-Method" not in request.headers:
            return None
        allow = self.allow(request.headers.get("Origin"))
        if allow is None:
            raise ApiError(
                403,
                "This origin may not call the API (server.cors_allowed_origins)",
                type="permission_error",
                code="cors_origin_not_allowed",
            )
        headers = {
            "Access-Control-Allow-Origin": allow,
            "Access-Control-Allow-Methods": METHODS,
            "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", "*"),
            "Access-Control-Max-Age": str(MAX_AGE_S),
        }
        if allow != "*":
            headers["Vary"] = "Origin"
        return web.Response(status=204, headers=headers)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """aiohttp's `on_response_prepare`: every response, streams too, before its head is sent."""
        allow = self.allow(request.headers.get("Origin"))
        if allow is None or "Access-Control-Allow-Origin" in response.headers:
            return
        response.headers["Access-Control-Allow-Origin"] = allow
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
        if allow != "*":
            response.headers.add("Vary", "Origin")
