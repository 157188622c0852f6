"""Cross-origin requests (`server.cors_allowed_origins`, http/net/cors.py): off by default; with
origins configured, preflights are answered before the API key check and every response to an
allowed origin carries Access-Control-Allow-Origin, streams included."""

from __future__ import annotations

from typing import Any

from http_helpers import assert_error, post, request, serving

APP = "http://app.example:3000"
CHAT = "/v1/chat/completions"
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def _chat(model: str, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": messages, "max_tokens": 3, "stream": stream}


def test_off_by_default(synthetic_engine: Any) -> None:
    with serving(synthetic_engine) as srv:
        resp = post(srv, CHAT, _chat(synthetic_engine.model_name), {"Origin": APP})
        assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers
        assert request(srv, "OPTIONS", CHAT, headers={"Origin": APP, **PREFLIGHT}).status_code == 405


def test_an_allowed_origin_is_answered_and_another_is_not(synthetic_engine: Any) -> None:
    model = synthetic_engine.model_name
    with serving(synthetic_engine, f"server.cors_allowed_origins=[{APP}]", "server.api_keys=[k]") as srv:
        # no key: a browser sends none with a preflight
        pre = request(srv, "OPTIONS", CHAT, headers={"Origin": APP, **PREFLIGHT})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == APP and pre.headers["vary"] == "Origin"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert pre.headers["access-control-allow-headers"] == PREFLIGHT["Access-Control-Request-Headers"]
        other = request(srv, "OPTIONS", CHAT, headers={"Origin": "http://evil.example", **PREFLIGHT})
        assert_error(other, 403, code="cors_origin_not_allowed")
        key = {"Authorization": "Bearer k"}
        for stream in (False, True):
            resp = post(srv, CHAT, _chat(model, stream), {"Origin": APP, **key})
            assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == APP
            assert "Origin" in resp.headers["vary"]
        denied = post(srv, CHAT, _chat(model), {"Origin": APP})  # the key is still needed
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == APP
        resp = post(srv, CHAT, _chat(model), {"Origin": "http://evil.example", **key})
        assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers


def test_any_origin(synthetic_engine: Any) -> None:
    with serving(synthetic_engine, "server.cors_allowed_origins=['*']") as srv:
        resp = request(srv, "GET", "/v1/models", headers={"Origin": "http://x.example"})
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "*"
        assert request(srv, "GET", "/v1/models").headers.get("access-control-allow-origin") is None
