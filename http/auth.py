"""Bearer API keys (`server.api_keys`); every route but /health needs one when any is configured."""

from __future__ import annotations

import hmac

from .errors import ApiError

OPEN_PATHS = frozenset({"/health"})


class ApiKeys:
    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = [k.encode() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, path: str, authorization: str | None) -> None:
        """Raises a 401 unless the header is `Bearer <a configured key>`."""
        if not self._keys or path in OPEN_PATHS:
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
