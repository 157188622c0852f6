"""Fetching an http(s) image URL behind the SSRF guard (guard.py).

Each hop: the URL's host must be in `vision.allowed_domains`; its name is resolved once and every
address checked; the connection goes to those addresses only (a resolver pinned to them, so a
second DNS answer cannot swap in a private address); TLS still verifies the URL's host name. A
redirect is followed (at most `MAX_REDIRECTS`) only to the same host, never from https down to
http, and is checked again. The body streams in under `vision.max_image_bytes`; the whole fetch,
redirects included, is bounded by `vision.fetch_timeout_s`."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from rillet.core.config.vision import VisionConfig
from rillet.core.vision.image import ImageError, ImageErrorKind
from rillet.http.vision.guard import AddressCheck, host_allowed, is_public, resolve_checked
from rillet.http.vision.sources import too_large
from yarl import URL

MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 64 * 1024


class PinnedResolver(AbstractResolver):
    """Answers for one host with the addresses already checked; any other name is an error."""

    def __init__(self, host: str, addresses: list[str]) -> None:
        self._host = host
        self._addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self._host:
            raise OSError(f"{host!r} was not checked")
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for a in self._addresses
        ]

    async def close(self) -> None:
        return None


class Fetcher:
    """`address_ok`: the check every resolved address must pass. The server always uses
    `is_public`; tests hand their own to fetch from a local server."""

    def __init__(self, cfg: VisionConfig, address_ok: AddressCheck = is_public) -> None:
        self._cfg = cfg
        self.address_ok = address_ok

    async def fetch(self, url: str, part: str) -> bytes:
        timeout = self._cfg.fetch_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await self._follow(URL(url), part)
        except ImageError:
            raise
        except TimeoutError as e:
            raise _failed(part, f"fetching the image took over {timeout} s (vision.fetch_timeout_s)") from e
        except (aiohttp.ClientError, OSError, ValueError) as e:  # ValueError: a URL yarl cannot use
            raise _failed(part, f"cannot fetch the image: {type(e).__name__}") from e

    async def _follow(self, url: URL, part: str) -> bytes:
        origin: URL | None = None
        for _ in range(MAX_REDIRECTS + 1):
            self._check_target(url, origin, part)
            host = url.raw_host or ""
            port = url.port or (443 if url.scheme == "https" else 80)
            addresses = await resolve_checked(host, port, part, self.address_ok)
            location = await self._get(url, host, addresses, part)
            if isinstance(location, bytes):
                return location
            origin = origin or url
            url = url.join(URL(location))
        raise _failed(part, f"the image URL redirects more than {MAX_REDIRECTS} times")

    def _check_target(self, url: URL, origin: URL | None, part: str) -> None:
        host = (url.raw_host or "").lower()
        if url.scheme not in ("http", "https") or not host:
            raise ImageError(ImageErrorKind.FORBIDDEN, part, f"cannot fetch {url.scheme!r} URLs")
        if origin is not None:
            if host != (origin.raw_host or "").lower():
                msg = f"the image URL redirects to another host ({host!r}); only same-host ones are followed"
                raise ImageError(ImageErrorKind.FORBIDDEN, part, msg)
            if origin.scheme == "https" and url.scheme == "http":
                raise ImageError(ImageErrorKind.FORBIDDEN, part, "the image URL redirects from https to http")
        if not host_allowed(host, self._cfg.allowed_domains):
            msg = f"images are not fetched from {host!r} (vision.allowed_domains)"
            raise ImageError(ImageErrorKind.FORBIDDEN, part, msg)

    async def _get(self, url: URL, host: str, addresses: list[str], part: str) -> bytes | str:
        """The body, or a redirect's Location."""
        connector = aiohttp.TCPConnector(
            resolver=PinnedResolver(host, addresses), use_dns_cache=False, force_close=True
        )
        headers = {"Accept": "image/*", "Accept-Encoding": "identity", "User-Agent": "rillet"}
        async with (
            aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False) as session,
            session.get(url, allow_redirects=False, headers=headers) as resp,
        ):
            if resp.status in _REDIRECTS:
                location = resp.headers.get("Location")
                if not location:
                    raise _failed(part, f"the image URL answered {resp.status} without a Location")
                return location
            if resp.status != 200:
                raise _failed(part, f"the image URL answered HTTP {resp.status}")
            return await _read_limited(resp, self._cfg.max_image_bytes, part)


async def _read_limited(resp: aiohttp.ClientResponse, limit: int, part: str) -> bytes:
    if (resp.content_length or 0) > limit:
        raise too_large(part, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise too_large(part, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _failed(part: str, message: str) -> ImageError:
    return ImageError(ImageErrorKind.FETCH_FAILED, part, message)
