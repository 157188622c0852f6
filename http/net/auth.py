"""API keys (`server.api_keys`): `Authorization: Bearer <key>` (OpenAI) or `x-api-key: <key>`
(Anthropic); every route but /health and the browser page's static files needs one when any is
configured.

Routes are matched by their canonical form (`/ui/{version}/{name}`), never by the raw path, so no
spelling of a path (`/ui/../v1/models`, percent-escapes) can reach an API route without a key.
"""

from __future__ import annotations

import hmac

from rillet.http.openai.errors import ApiError


class ApiKeys:
    def __init__(self, keys: tuple[str, ...], open_routes: frozenset[str] = frozenset()) -> None:
        """`open_routes`: canonical routes that need no key (health, the browser page's files)."""
        self._keys = [k.encode() for k in keys]
        self._open = open_routes

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, route: str, authorization: str | None, x_api_key: str | None = None) -> None:
        """Raises a 401 unless a header holds a configured key (`Authorization: Bearer <key>`, or
        else `x-api-key: <key>`) or `route` (the matched route's canonical form; "unmatched" for
        none) is open."""
        if not self._keys or route in self._open:
            return
        if not authorization and x_api_key is not None:
            self._compare(x_api_key.strip().encode())
            return
        if not authorization:
            raise _unauthorized("Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("Malformed Authorization header: expected 'Bearer <key>'")
        self._compare(token.strip().encode())

    def _compare(self, given: bytes) -> None:
        # Compare against every key (no early exit) so timing reveals neither key nor position.
        ok = False
        for key in self._keys:
            ok |= hmac.compare_digest(given, key)
        if not ok:
            raise _unauthorized("Incorrect API key provided")


def _unauthorized(message: str) -> ApiError:
    return ApiError(
        401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="rillet"'}
    )
