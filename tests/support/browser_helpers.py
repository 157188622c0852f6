"""Headless Chromium for the page at `/`: Debian's `chromium` package driven by Playwright.

No browser is downloaded: Playwright launches the system binary. `chromium_missing()` says why the
browser tests skip (no binary, or no playwright package) so `make test` still runs without them.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from repo import BENCH_OUT

CHROMIUM = os.environ.get("RILLET_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# What works in a container as root, with no network beyond the server under test.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1200, "height": 760}
SHOTS = BENCH_OUT / "ui"


def chromium_missing() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A browser; Playwright gives each launch a fresh profile (user-data-dir) of its own."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# Records the last answer's text length after each DOM mutation, and its state then.
OBSERVE_ANSWER = """() => {
  window.__updates = [];
  const list = document.getElementById("messages");
  new MutationObserver(() => {
    const items = list.querySelectorAll("li.msg.assistant");
    const last = items[items.length - 1];
    if (!last) return;
    const len = last.querySelector(".content").textContent.length;
    window.__updates.push({ len, state: last.dataset.state, n: items.length });
  }).observe(list, { subtree: true, childList: true, characterData: true, attributes: true });
}"""


def streamed_lengths(updates: list[dict[str, Any]], n: int, final: int) -> set[int]:
    """Distinct partial lengths answer #n showed while still streaming."""
    return {u["len"] for u in updates if u["n"] == n and u["state"] == "streaming" and 0 < u["len"] < final}


def metric_values(host: str, port: int, key: str | None = None) -> dict[str, float]:
    """/metrics as {sample name with labels: value}."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([^#\s][^\s]*) ([0-9.e+-]+|NaN|\+Inf)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def chat(host: str, port: int, body: dict[str, Any]) -> dict[str, Any]:
    """One non-streamed chat completion."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", orjson.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, data
        return orjson.loads(data)  # type: ignore[no-any-return]
    finally:
        conn.close()


class LoadGen:
    """Streaming chat requests from `streams` threads, started a beat apart, until `stop()`. They
    share a long system prompt, so the prefix cache has something to hit."""

    def __init__(self, host: str, port: int, model: str, streams: int, max_tokens: int) -> None:
        self.host, self.port = host, port
        self.system = "You answer questions about rivers, lakes and the sea. " * 8
        self.model, self.max_tokens = model, max_tokens
        self.done = threading.Event()
        self.completed = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(streams)]

    def start(self) -> LoadGen:
        for i, t in enumerate(self.threads):
            t.start()
            if self.done.wait(0.4 if i else 0):
                break
        return self

    def _run(self, i: int) -> None:
        turn = 0
        while not self.done.is_set():
            body = {
                "model": self.model,
                "messages": [
                    {"role": "system", "content": self.system},
                    {"role": "user", "content": f"Question {i}.{turn}: how long is river {turn}?"},
                ],
                "max_tokens": self.max_tokens,
                "stream": True,
            }
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                conn.request(
                    "POST", "/v1/chat/completions", orjson.dumps(body), {"Content-Type": "application/json"}
                )
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    self.completed += 1
                else:
                    self.errors.append(str(resp.status))
            except OSError as exc:
                self.errors.append(repr(exc))
            finally:
                conn.close()
            turn += 1

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(60)


class Page:
    """A fresh context (own sessionStorage) with the page loaded; records every URL it requests."""

    def __init__(self, browser: Any, root: str, hash_: str = "") -> None:
        self.root = root
        self.ctx = browser.new_context(viewport=VIEWPORT)
        self.page = self.ctx.new_page()
        self.urls: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{root}/{hash_}")

    def ready(self) -> Any:
        self.page.wait_for_selector("#server-status[data-state=ok]", timeout=15000)
        return self.page

    def send(self, text: str) -> dict[str, Any]:
        """Types and sends a message; returns the JSON body the page posted."""
        p = self.page
        p.fill("#prompt", text)
        with p.expect_request("**/v1/chat/completions") as req:
            p.press("#prompt", "Enter")
        return orjson.loads(req.value.post_data)  # type: ignore[no-any-return]

    def answer(self, n: int, state: str = "done") -> str:
        item = f"li.msg.assistant:nth-of-type({2 * n})"  # user, assistant, user, ...
        self.page.wait_for_selector(f"{item}[data-state={state}]", state="attached", timeout=60000)
        return str(self.page.text_content(f"{item} .content"))

    def stats(self, n: int) -> dict[str, str]:
        return self.page.eval_on_selector(  # type: ignore[no-any-return]
            f"li.msg.assistant:nth-of-type({2 * n}) .stats", "e => ({...e.dataset, text: e.textContent})"
        )

    def close(self) -> None:
        others = [u for u in self.urls if not u.startswith(self.root + "/")]
        self.ctx.close()
        assert not others, f"the page called other hosts: {others}"
        assert not self.errors, self.errors


def unstreamed(body: dict[str, Any]) -> dict[str, Any]:
    """The same request, not streamed."""
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


def shot(page: Any, name: str) -> None:
    """bench/out/ui/<name>.png, and a 128-colour copy (<name>-small.png, ~25 KB) for the README."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    full = SHOTS / f"{name}.png"
    page.screenshot(path=str(full))
    try:
        from PIL import Image
    except ImportError:
        return
    small = Image.open(full).convert("RGB").quantize(128, dither=Image.Dither.NONE)
    small.save(SHOTS / f"{name}-small.png", optimize=True)


def histogram_quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets, +Inf last."""
    count = cumulative[-1][1]
    if count <= 0:
        return None
    rank = q * count
    b = next((i for i, (_, c) in enumerate(cumulative[:-1]) if c >= rank), len(cumulative) - 1)
    if b == len(cumulative) - 1:
        return cumulative[-2][0]
    start, below = (0.0, 0.0) if b == 0 else cumulative[b - 1]
    end, here = cumulative[b]
    return start + (end - start) * (rank - below) / (here - below)
