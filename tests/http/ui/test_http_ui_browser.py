"""The page at `/` in a real browser: headless Chromium (Debian's package, driven by Playwright)
against `rillet serve` with the synthetic model, and against the real default model for greedy
equality. Skipped where Chromium or Playwright is missing. Screenshots go to bench/out/ui/."""

from __future__ import annotations

import http.client
import re
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from browser_helpers import (
    OBSERVE_ANSWER,
    LoadGen,
    Page,
    chat,
    chromium,
    chromium_missing,
    histogram_quantile,
    metric_values,
    shot,
    streamed_lengths,
    unstreamed,
)
from http_helpers import serving, wait_for
from proc_helpers import ServeProcess

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))

RUNNING = "rillet_num_requests_running"
PAYLOAD = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    # 15 ms steps: answers take long enough to watch them stream and to stop them
    srv = ServeProcess("model.synthetic_step_ms=15", "model.max_model_len=4096")
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def test_chat_streams_equals_non_streamed_and_keeps_the_conversation(
    server: ServeProcess, browser: Any
) -> None:
    ui = Page(browser, server.root_url)
    try:
        p = ui.ready()
        p.fill("#system", "You are a terse assistant.")
        p.fill("#temperature", "0")
        p.fill("#max_tokens", "64")
        p.evaluate(OBSERVE_ANSWER)
        sent = ui.send("Tell me about rivers.")
        assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
        assert sent["temperature"] == 0 and sent["max_tokens"] == 64 and "seed" not in sent
        assert [m["role"] for m in sent["messages"]] == ["system", "user"]
        first = ui.answer(1)
        # streamed: the text grew through several DOM updates before the stream ended
        lengths = streamed_lengths(p.evaluate("window.__updates"), 1, len(first))
        assert len(lengths) >= 3, lengths
        # the same greedy request, not streamed, gives the same text and the same usage
        plain = chat(server.host, server.port, unstreamed(sent))
        assert plain["choices"][0]["message"]["content"] == first
        stats = ui.stats(1)
        assert int(stats["completionTokens"]) == plain["usage"]["completion_tokens"] == 64
        assert int(stats["promptTokens"]) == plain["usage"]["prompt_tokens"]
        assert "TTFT" in stats["text"] and "tok/s" in stats["text"] and int(stats["ttftMs"]) >= 0

        # second turn: the whole conversation goes back, its prefix comes from the KV cache
        sent2 = ui.send("And lakes?")
        assert sent2["messages"][:3] == [*sent["messages"], {"role": "assistant", "content": first}]
        second = ui.answer(2)
        assert len(streamed_lengths(p.evaluate("window.__updates"), 2, len(second))) >= 3
        assert int(ui.stats(2)["cachedTokens"]) > 0
    finally:
        ui.close()


def test_stop_aborts_the_request_on_the_server(server: ServeProcess, browser: Any) -> None:
    ui = Page(browser, server.root_url)
    try:
        p = ui.ready()
        p.fill("#max_tokens", "3000")  # ~45 s of 15 ms steps: only Stop ends it early
        generated = metric_values(server.host, server.port)["rillet_generation_tokens_total"]
        ui.send("Write a very long story.")
        p.wait_for_function(
            "() => document.querySelector('li.msg.assistant .content').textContent.length > 40", timeout=15000
        )
        assert metric_values(server.host, server.port)[RUNNING] == 1
        p.click("#stop")
        ui.answer(1, state="stopped")
        assert "stopped" in ui.stats(1)["text"]
        wait_for(lambda: metric_values(server.host, server.port)[RUNNING] == 0, 10, "running back to 0")
        after = metric_values(server.host, server.port)
        assert after["rillet_active_streams"] == 0
        assert after["rillet_generation_tokens_total"] - generated < 3000  # cut short, not finished
        assert p.is_enabled("#send") and not p.is_enabled("#stop")
    finally:
        ui.close()


def test_dashboard_charts_update_under_load(server: ServeProcess, browser: Any) -> None:
    ui = Page(browser, server.root_url, "#dashboard")
    model = orjson.loads(ui.page.request.get(f"{server.root_url}/v1/models").body())["data"][0]["id"]
    load = LoadGen(server.host, server.port, model, streams=6, max_tokens=48)
    try:
        p = ui.page
        p.select_option("#span", "60")
        p.wait_for_selector("#dash-status[data-state=ok]", timeout=10000)

        def image(chart: str) -> str:
            return str(p.evaluate(f"document.querySelector('#{chart} canvas').toDataURL()"))

        def value(chart: str, series: str) -> float:
            v = p.get_attribute(f"#{chart} .value[data-series='{series}']", "data-value")
            return float(v) if v else float("nan")

        total = metric_values(server.host, server.port)["rillet_kv_blocks_total"]
        kv_total = "document.querySelector('#chart-kv .value[data-series=total]').dataset.value"
        p.wait_for_function(f"() => {kv_total} == '{total:g}'")
        idle = {c: image(c) for c in ("chart-tokps", "chart-requests", "chart-kv")}
        load.start()
        seen: dict[str, set[str]] = {c: set() for c in idle}
        saw = {"tok/s": 0.0, "running": 0.0, "used": 0.0, "hit": 0.0, "ttft": 0.0, "itl": 0.0}
        deadline = time.monotonic() + 60  # bounds a hang: it ends once every chart has moved
        while time.monotonic() < deadline:
            for c in seen:
                seen[c].add(image(c))
            saw["tok/s"] = max(saw["tok/s"], value("chart-tokps", "tok/s"))
            saw["running"] = max(saw["running"], value("chart-requests", "running"))
            saw["used"] = max(saw["used"], value("chart-kv", "used"))
            saw["hit"] = max(saw["hit"], value("chart-hit", "hit rate"))
            saw["ttft"] = max(saw["ttft"], value("chart-ttft", "p99"))
            saw["itl"] = max(saw["itl"], value("chart-itl", "p50"))
            if all(v > 0 for v in saw.values()) and all(len(s - {idle[c]}) >= 3 for c, s in seen.items()):
                break
            time.sleep(0.5)
        assert all(v > 0 for v in saw.values()), saw
        # each chart was redrawn with new data several times while the load ran
        for c, images in seen.items():
            assert len(images - {idle[c]}) >= 3, c
        time.sleep(2)  # a few more seconds of history for the screenshot
        p.set_viewport_size({"width": 1200, "height": 580})  # the charts, not the empty space below
        shot(p, "dashboard")
    finally:
        load.stop()
        ui.close()
    assert load.completed > 0 and not load.errors, load.errors


def test_dashboard_percentiles_are_promqlshistogram_quantile(server: ServeProcess, browser: Any) -> None:
    ui = Page(browser, server.root_url)
    try:
        p = ui.ready()
        model = p.input_value("#model")
        for n in (3, 9, 27):  # a few observations of each histogram
            msg = {"role": "user", "content": f"count to {n}"}
            chat(server.host, server.port, {"model": model, "messages": [msg], "max_tokens": n})
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        compute = """async ([text, name]) => {
          const src = document.querySelector("script[type=module]").src.replace("app.js", "prom.js");
          const prom = await import(src);
          const b = prom.buckets(prom.parseMetrics(text), name);
          return { b, q: [0.5, 0.9, 0.99].map((q) => prom.quantile(q, b)) };
        }"""
        for name in ("rillet_time_to_first_token_seconds", "rillet_inter_token_latency_seconds"):
            got = p.evaluate(compute, [text, name])
            pairs = re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)
            cumulative = [(float(le), float(c)) for le, c in pairs]
            assert cumulative[-1][0] == float("inf") and cumulative[-1][1] > 0, name
            assert [c for _, c in cumulative] == [c for _, c in got["b"]], name
            want = [histogram_quantile(q, cumulative) for q in (0.5, 0.9, 0.99)]
            assert got["q"] == pytest.approx(want, rel=1e-9), name
    finally:
        ui.close()


def test_markup_in_a_reply_or_an_error_is_shown_as_text(server: ServeProcess, browser: Any) -> None:
    ui = Page(browser, server.root_url)
    try:
        p = ui.ready()
        listen = "e => window.__csp.push(e.violatedDirective)"
        p.evaluate(f"window.__csp = []; document.addEventListener('securitypolicyviolation', {listen})")
        pieces = ["Look: <im", "g src=x oner", "ror=alert(1)>", " and <script>alert(2)</script>"]
        events = [{"choices": [{"index": 0, "delta": {"content": c}, "finish_reason": None}]} for c in pieces]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        sse = "".join(f"data: {orjson.dumps(e).decode()}\n\n" for e in events) + "data: [DONE]\n\n"
        error = {
            "error": {
                "message": f"bad model {PAYLOAD}",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        replies = [
            {"status": 200, "headers": {"Content-Type": "text/event-stream"}, "body": sse},
            {"status": 400, "headers": {"Content-Type": "application/json"}, "body": orjson.dumps(error)},
            {
                "status": 200,
                "headers": {"Content-Type": "text/event-stream"},
                "body": f"data: {orjson.dumps(error).decode()}\n\n",
            },
        ]
        p.route("**/v1/chat/completions", lambda route: route.fulfill(**replies.pop(0)))

        ui.send(PAYLOAD)  # the user's own message holds it too
        assert ui.answer(1) == "".join(pieces)
        ui.send("again")
        ui.answer(2, state="error")
        ui.send("and again")
        ui.answer(3, state="error")
        errors = p.eval_on_selector_all("#messages .error", "es => es.map(e => e.textContent)")
        assert errors == [f"bad model {PAYLOAD}"] * 2
        assert p.text_content("li.msg.user .content") == PAYLOAD
        assert p.locator("#messages img").count() == 0 and p.locator("#messages script").count() == 0
        assert ui.dialogs == [] and p.evaluate("window.__csp") == []
        # and the page could not have inserted HTML if it tried: Trusted Types refuse the string
        sink = "() => { try { document.body.innerHTML = '<b>x</b>'; } catch (e) { return e.name; } }"
        assert p.evaluate(sink) == "TypeError"
    finally:
        ui.close()


def test_api_key_is_asked_for_and_sent_as_a_bearer_token(synthetic_engine: Any, browser: Any) -> None:
    with serving(synthetic_engine, "server.api_keys=[sekret-key]") as srv:
        ui = Page(browser, srv.root_url)
        try:
            p = ui.page
            p.wait_for_selector("#key-dialog[open]", timeout=10000)
            p.fill("#key-input", "wrong")
            p.press("#key-input", "Enter")
            p.wait_for_selector("#key-dialog[open] #key-error:not([hidden])", timeout=10000)
            p.fill("#key-input", "sekret-key")
            with p.expect_request(
                lambda r: r.url.endswith("/v1/models") and "authorization" in r.headers
            ) as req:
                p.press("#key-input", "Enter")
            assert req.value.headers["authorization"] == "Bearer sekret-key"
            ui.ready()
            p.wait_for_selector(
                "#dash-status[data-state=ok]", state="attached", timeout=10000
            )  # with the key
            stored = p.evaluate(
                "[sessionStorage.getItem('rillet.apiKey'), localStorage.length, document.cookie]"
            )
            assert stored == ["sekret-key", 0, ""]  # this tab only
        finally:
            ui.close()


def test_real_model_answer_streams_and_equals_the_non_streamed_one(default_engine: Any, browser: Any) -> None:
    """SmolLM2-135M, greedy: the text the page shows is the non-streamed answer, both turns."""
    with serving(default_engine) as srv:
        ui = Page(browser, srv.root_url)
        try:
            p = ui.ready()
            p.fill("#temperature", "0")
            p.fill("#max_tokens", "16")
            p.evaluate(OBSERVE_ANSWER)
            for n, question in enumerate(["What is the capital of France?", "And of Italy?"], 1):
                sent = ui.send(question)
                text = ui.answer(n)
                assert len(streamed_lengths(p.evaluate("window.__updates"), n, len(text))) >= 3
                plain = chat(srv.host, srv.port, unstreamed(sent))
                assert text and plain["choices"][0]["message"]["content"] == text
            assert int(ui.stats(2)["cachedTokens"]) > 0  # the first turn's blocks, from the prefix cache
            p.fill("#prompt", "")
            p.locator("#prompt").blur()
            shot(p, "chat")
        finally:
            ui.close()
