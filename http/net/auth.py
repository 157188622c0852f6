"""Bearer API keys (`server.api_keys`); every route but /health and the browser page's static files
needs one when any is configured.

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

    def check(self, route: str, authorization: str | None) -> None:
        """Raises a 401 unless the header is `Bearer <a configured key>` or `route` (the matched
        route's canonical form; "unmatched" for none) is open."""
        if not self._keys or route in self._open:
            return
        if not authorization:
            raise _unauthorized("Missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("Malformed Authorization header: expected 'Bearer <key>'")
        given = token.strip().encode()
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
