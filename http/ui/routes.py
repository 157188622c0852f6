"""The browser page at `/`: a chat playground and a live dashboard, shipped as static files.

No build step and no other host: `static/` holds plain HTML, CSS and ES modules, read once when the
app is built. Assets live under a content-versioned path (`/ui/<version>/<name>`), so browsers keep
them for good (immutable) while the page itself is revalidated on each load (ETag, 304).

The Content-Security-Policy allows this origin's scripts, styles, images and fetches and nothing
else: no inline code, no other host, no framing, no form posts. Trusted Types are required and no
policy may be created, so the browser itself refuses any HTML string assigned to the DOM
(`innerHTML` and friends throw): model output and error messages can only be inserted as text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

STATIC_DIR = Path(__file__).with_name("static")
PAGE_ROUTE = "/"
ASSET_ROUTE = "/ui/{version}/{name}"
PUBLIC_ROUTES = frozenset({PAGE_ROUTE, ASSET_ROUTE})  # no API key needed: static, no secrets
_PAGE = "index.html"
_VERSION_MARK = b"__VERSION__"  # in index.html: replaced by the assets' version

CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)
_COMMON_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_PAGE_HEADERS = {
    **_COMMON_HEADERS,
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate each load: it names the current assets' version
}
_ASSET_HEADERS = {**_COMMON_HEADERS, "Cache-Control": "public, max-age=31536000, immutable"}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class _File:
    body: bytes
    content_type: str
    etag: str


class StaticUi:
    """The page and its assets, in memory (a few tens of KB); names outside `static/` never match."""

    def __init__(self, folder: Path = STATIC_DIR) -> None:
        raw = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in _TYPES}
        if _PAGE not in raw:
            raise FileNotFoundError(f"{folder / _PAGE} is missing: the package was installed without it")
        digest = hashlib.sha256()
        for name, body in raw.items():
            digest.update(name.encode() + b"\0" + body + b"\0")
        self.version = digest.hexdigest()[:16]
        page = raw.pop(_PAGE).replace(_VERSION_MARK, self.version.encode())
        self.page = _file(_PAGE, page)
        self.assets = {name: _file(name, body) for name, body in raw.items()}

    async def serve_page(self, request: web.Request) -> web.StreamResponse:
        return _respond(request, self.page, _PAGE_HEADERS)

    async def serve_asset(self, request: web.Request) -> web.StreamResponse:
        asset = self.assets.get(request.match_info["name"])
        if asset is None or request.match_info["version"] != self.version:
            raise web.HTTPNotFound()
        return _respond(request, asset, _ASSET_HEADERS)


def _file(name: str, body: bytes) -> _File:
    etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
    return _File(body, _TYPES[Path(name).suffix], etag)


def _respond(request: web.Request, f: _File, headers: dict[str, str]) -> web.Response:
    out = {**headers, "ETag": f.etag}
    tags = _etags(request.headers.get("If-None-Match", ""))
    if f.etag in tags or "*" in tags:
        return web.Response(status=304, headers=out)
    return web.Response(body=f.body, headers={**out, "Content-Type": f.content_type})


def _etags(header: str) -> set[str]:
    return {t.strip().removeprefix("W/") for t in header.split(",")} if header else set()


def add_ui_routes(app: web.Application) -> None:
    ui = StaticUi()
    app.router.add_get(PAGE_ROUTE, ui.serve_page)
    app.router.add_get(ASSET_ROUTE, ui.serve_asset)
