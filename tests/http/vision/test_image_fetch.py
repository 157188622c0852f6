"""Fetching image URLs (http/vision/fetch.py) against a local aiohttp server on 127.0.0.1.

The server's own address check (`is_public`) refuses 127.0.0.1, so the tests that need a fetch
to go through build their `Fetcher` with a permissive check (the constructor's seam; the server
never passes one). With the real check, a loopback URL is refused before any connection, even
with 127.0.0.1 or localhost in `vision.allowed_domains`. The redirect, byte-limit and timeout
rules, and the pinned resolution (the name is resolved once, and the connection goes to the
address checked), run over real sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from http_doubles.images import image_bytes
from rillet.core.config import load_config
from rillet.core.config.vision import VisionConfig
from rillet.core.vision.image import ImageError, ImageErrorKind
from rillet.http.vision.fetch import Fetcher, PinnedResolver

PNG = image_bytes(32, 32)
PART = "input[0].content[1]"


def vision(*overrides: str) -> VisionConfig:
    return load_config(None, list(overrides)).vision


def anything(_: object) -> bool:
    return True


def image_app(hits: list[str], release: asyncio.Event) -> web.Application:
    async def hold(_: web.Request) -> web.Response:
        await release.wait()  # no answer until the test is over: the fetch's timeout ends it
        return web.Response(body=PNG)

    async def img(request: web.Request) -> web.StreamResponse:
        hits.append(request.path)
        return web.Response(body=PNG, content_type="image/png")

    async def chunked(request: web.Request) -> web.StreamResponse:  # no Content-Length
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(64):
            await resp.write(bytes(1024))
        await resp.write_eof()
        return resp

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=bytes(8192), content_type="image/png")

    async def redirect(request: web.Request) -> web.Response:
        hits.append(request.path)
        raise web.HTTPFound(request.query["to"])

    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    app = web.Application()
    app.router.add_get("/img.png", img)
    app.router.add_get("/big", chunked)
    app.router.add_get("/large", large)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/loop", loop)
    app.router.add_get("/hold", hold)
    return app


def run(test: Callable[[str, list[str]], Awaitable[Any]]) -> Any:
    """`test(base_url, hits)` with a server on 127.0.0.1 running meanwhile."""

    async def main() -> Any:
        hits: list[str] = []
        release = asyncio.Event()
        runner = web.AppRunner(image_app(hits, release))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            return await test(f"http://127.0.0.1:{port}", hits)
        finally:
            release.set()
            await runner.cleanup()

    return asyncio.run(main())


def refusal(fetcher: Fetcher, url: str) -> Callable[[str, list[str]], Awaitable[ImageError]]:
    async def go(base: str, hits: list[str]) -> ImageError:
        with pytest.raises(ImageError) as err:
            await fetcher.fetch(url.format(base=base, port=base.rsplit(":", 1)[1]), PART)
        assert err.value.part == PART
        return err.value

    return go


def test_an_allowed_url_is_fetched() -> None:
    fetcher = Fetcher(vision('vision.allowed_domains=["127.0.0.1"]'), anything)

    async def go(base: str, hits: list[str]) -> bytes:
        return await fetcher.fetch(f"{base}/img.png", PART)

    assert run(go) == PNG


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_is_refused_even_when_listed(host: str) -> None:
    fetcher = Fetcher(vision(f'vision.allowed_domains=["{host}"]'))  # the server's check

    async def go(base: str, hits: list[str]) -> None:
        err = await refusal(fetcher, f"http://{host}:{{port}}/img.png")(base, hits)
        assert err.kind is ImageErrorKind.FORBIDDEN and "private or reserved" in err.message
        assert hits == []  # no connection was made

    run(go)


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "[::ffff:127.0.0.1]", "[::1]", "127.1"])
def test_other_spellings_of_loopback_are_refused(host: str) -> None:
    """With every host allowed, loopback written as a number, in hex, short, or inside IPv6."""
    fetcher = Fetcher(vision('vision.allowed_domains=["*"]'))

    async def go(base: str, hits: list[str]) -> None:
        err = await refusal(fetcher, f"http://{host}:{{port}}/img.png")(base, hits)
        assert err.kind is ImageErrorKind.FORBIDDEN, err
        assert hits == []

    run(go)


def test_hosts_outside_the_list_are_refused() -> None:
    for cfg in (vision(), vision('vision.allowed_domains=["example.com"]')):
        err = run(refusal(Fetcher(cfg, anything), "{base}/img.png"))
        assert err.kind is ImageErrorKind.FORBIDDEN and "vision.allowed_domains" in err.message


def test_same_host_redirects_are_followed_and_others_refused() -> None:
    fetcher = Fetcher(vision('vision.allowed_domains=["127.0.0.1", "localhost"]'), anything)

    async def go(base: str, hits: list[str]) -> None:
        assert await fetcher.fetch(f"{base}/redirect?to=/img.png", PART) == PNG  # relative
        assert await fetcher.fetch(f"{base}/redirect?to={base}/img.png", PART) == PNG  # absolute
        assert hits == ["/redirect", "/img.png", "/redirect", "/img.png"]
        port = base.rsplit(":", 1)[1]
        other = f"http://localhost:{port}/img.png"  # the same server under another host name
        with pytest.raises(ImageError) as err:
            await fetcher.fetch(f"{base}/redirect?to={other}", PART)
        assert err.value.kind is ImageErrorKind.FORBIDDEN and "another host" in err.value.message
        assert hits[-1] == "/redirect"  # the other host was never asked
        with pytest.raises(ImageError) as err:
            await fetcher.fetch(f"{base}/loop", PART)
        assert err.value.kind is ImageErrorKind.FETCH_FAILED and "redirects more than" in err.value.message

    run(go)


def test_the_byte_limit_holds_with_and_without_a_length() -> None:
    fetcher = Fetcher(vision('vision.allowed_domains=["127.0.0.1"]', "vision.max_image_bytes=4096"), anything)
    for path in ("/large", "/big"):  # a declared length over it; a chunked body growing past it
        err = run(refusal(fetcher, "{base}" + path))
        assert err.kind is ImageErrorKind.TOO_LARGE and "vision.max_image_bytes" in err.message, path


def test_errors_and_timeouts_are_fetch_failures() -> None:
    cfg = vision('vision.allowed_domains=["127.0.0.1"]', "vision.fetch_timeout_s=0.2")
    fetcher = Fetcher(cfg, anything)
    for path in ("/missing.png", "/hold"):
        err = run(refusal(fetcher, "{base}" + path))
        assert err.kind is ImageErrorKind.FETCH_FAILED, path
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    err = run(refusal(fetcher, f"http://127.0.0.1:{port}/img.png"))
    assert err.kind is ImageErrorKind.FETCH_FAILED


def test_the_connection_goes_to_the_address_checked() -> None:
    """DNS rebinding: a name that answers a public address to the check and a private one later.
    The name is resolved once; the connection uses that answer (here a stand-in, 127.0.0.1)."""
    fetcher = Fetcher(vision('vision.allowed_domains=["images.test"]'), anything)

    async def go(base: str, hits: list[str]) -> bytes:
        loop = asyncio.get_running_loop()
        real = loop.getaddrinfo
        asked: list[str] = []

        async def rebinding(host: str, port: int, *args: Any, **kwargs: Any) -> Any:
            asked.append(host)
            if len(asked) > 1:
                raise OSError("a second resolution: the connection must not resolve again")
            return await real("127.0.0.1", port, *args, **kwargs)

        loop.getaddrinfo = rebinding  # type: ignore[method-assign]
        port = base.rsplit(":", 1)[1]
        data = await fetcher.fetch(f"http://images.test:{port}/img.png", PART)
        assert asked == ["images.test"]
        return data

    assert run(go) == PNG


def test_the_pinned_resolver_answers_for_its_host_only() -> None:
    async def go() -> None:
        resolver = PinnedResolver("images.test", ["203.0.113.7", "2001:db8::7"])
        answers = await resolver.resolve("images.test", 443)
        assert [(a["host"], a["port"], a["family"]) for a in answers] == [
            ("203.0.113.7", 443, socket.AF_INET),
            ("2001:db8::7", 443, socket.AF_INET6),
        ]
        with pytest.raises(OSError):
            await resolver.resolve("elsewhere.test", 443)

    asyncio.run(go())
