"""The browser page at `/` over HTTP (no browser): headers, caching, auth, `server.ui`, and the
static files themselves (no other host, no HTML strings). test_http_ui_browser.py drives it in Chromium."""

from __future__ import annotations

import re

import pytest
from http_helpers import assert_error, request, serving
from rillet.core.config import ConfigError, load_config
from rillet.http.background import BackgroundServer
from rillet.http.ui.routes import CSP, STATIC_DIR, StaticUi

ASSETS = sorted(p.name for p in STATIC_DIR.iterdir() if p.name != "index.html")


def _asset_urls(page: str) -> list[str]:
    return re.findall(r'(?:src|href)="(ui/[0-9a-f]+/[\w.]+)"', page)


def test_page_is_served_with_a_strict_csp_and_revalidated() -> None:
    with serving(None) as srv:  # static files need no engine: the page loads while the model does
        resp = request(srv, "GET", "/")
        assert resp.status_code == 200, resp.text
        h = resp.headers
        assert h["content-type"] == "text/html; charset=utf-8"
        assert h["content-security-policy"] == CSP
        for directive in (
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "require-trusted-types-for 'script'",
            "frame-ancestors 'none'",
        ):
            assert directive in CSP
        assert "unsafe" not in CSP and "http" not in CSP  # no inline code, no other host
        assert h["x-content-type-options"] == "nosniff" and h["x-frame-options"] == "DENY"
        assert h["cache-control"] == "no-cache" and h["etag"]
        assert "__VERSION__" not in resp.text
        urls = _asset_urls(resp.text)
        assert {u.rsplit("/", 1)[1] for u in urls} >= {"app.js", "style.css", "favicon.svg"}

        again = request(srv, "GET", "/", headers={"If-None-Match": h["etag"]})
        assert again.status_code == 304 and again.content == b""
        assert request(srv, "HEAD", "/").status_code == 200


def test_assets_are_immutable_under_a_content_version() -> None:
    version = StaticUi().version
    with serving(None) as srv:
        for name in ASSETS:
            resp = request(srv, "GET", f"/ui/{version}/{name}")
            assert resp.status_code == 200, name
            assert resp.content == (STATIC_DIR / name).read_bytes()
            assert resp.headers["cache-control"] == "public, max-age=31536000, immutable"
            assert resp.headers["x-content-type-options"] == "nosniff"
            types = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}
            kind = types[name.rsplit(".", 1)[1]]
            assert resp.headers["content-type"].startswith(kind), name
        # another version, an unknown name, the page under the asset path, a way out of static/
        for path in (
            f"/ui/{'0' * len(version)}/app.js",
            f"/ui/{version}/nope.js",
            f"/ui/{version}/index.html",
            f"/ui/{version}/..%2Fui.py",
            f"/ui/{version}/%2E%2E%2Fserver.py",
        ):
            assert_error(request(srv, "GET", path), 404, code="unknown_url")


def test_with_api_keys_the_page_is_public_and_the_api_is_not() -> None:
    version = StaticUi().version
    with serving(None, "server.api_keys=[sekret]") as srv:
        assert request(srv, "GET", "/").status_code == 200
        assert request(srv, "GET", f"/ui/{version}/app.js").status_code == 200
        for path in ("/metrics", "/v1/models", f"/ui/{version}/../../metrics", "/ui/x/%2E%2E/%2E%2E/metrics"):
            assert_error(request(srv, "GET", path), 401, code="invalid_api_key")
        assert request(srv, "GET", "/metrics", headers={"Authorization": "Bearer sekret"}).status_code == 200


def test_ui_off_is_a_404_as_before() -> None:
    version = StaticUi().version
    with serving(None, "server.ui=off") as srv:
        assert_error(request(srv, "GET", "/"), 404, code="unknown_url")
        assert_error(request(srv, "GET", f"/ui/{version}/app.js"), 404, code="unknown_url")
        assert request(srv, "GET", "/health").status_code == 503  # the rest is unchanged


def test_ui_config_is_validated_naming_the_key() -> None:
    assert load_config(None).server.ui == "on"
    assert load_config(None, ["server.ui=off"]).server.ui == "off"
    assert load_config(None, ["server.ui=false"]).server.ui == "off"  # YAML reads a bare off as false
    with pytest.raises(ConfigError, match=r"server\.ui.*'on', 'off'") as err:
        load_config(None, ["server.ui=maybe"])
    assert err.value.key == "server.ui"


def test_static_files_call_no_other_host_and_build_no_html() -> None:
    svg_ns = "http://www.w3.org/2000/svg"  # an XML namespace name: never fetched
    for path in STATIC_DIR.iterdir():
        text = path.read_text()
        assert not re.search(r"(?:https?:|wss?:)?//[\w.-]+\.\w", text.replace(svg_ns, "")), path.name
        assert "@import" not in text and "url(" not in text, path.name
        if path.suffix == ".js":
            code = re.sub(r"^\s*//.*$", "", text, flags=re.M)  # comments may name what is avoided
            for sink in (
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                'setAttribute("on',
                "localStorage",
                "document.cookie",
            ):
                assert sink not in code, (path.name, sink)
    page = (STATIC_DIR / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", page)  # no inline script
    assert "<style" not in page and " style=" not in page
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", page)  # no inline event handler


def test_requests_to_the_page_are_counted_by_route(synth_server: BackgroundServer) -> None:
    assert request(synth_server, "GET", "/").status_code == 200
    text = request(synth_server, "GET", "/metrics").text
    assert 'rillet_requests_total{endpoint="/",status="200"}' in text
