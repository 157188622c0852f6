"""A client that costs (almost) nothing: the same requests as the SDK clients of
bench/lib/sdk_client.py, sent over a kept-alive http.client connection, the answer
read in 64 KiB pieces and parsed once at the end (no per-event parsing, no pydantic objects).

Why: with the official SDKs the client process spends ~0.15-0.45 ms of CPU a streamed token (and
~0.01 a non-streamed one) on its own core; this client tells the server's cost from the client's.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from typing import Any
from urllib.parse import urlsplit

_USAGE = {
    "chat": re.compile(rb'"completion_tokens":\s*(\d+)'),
    "responses": re.compile(rb'"output_tokens":\s*(\d+)'),
    "messages": re.compile(rb'"output_tokens":\s*(\d+)'),
}
_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


class RawClient:
    def __init__(self, base_url: str, api: str) -> None:
        url = urlsplit(base_url)
        self.conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=600)
        self.api = api

    def body(self, model: str, prompt: str, stream: bool, max_tokens: int) -> bytes:
        common: dict[str, Any] = {"model": model, "temperature": 0.0, "ignore_eos": True, "stream": stream}
        if self.api == "responses":
            return json.dumps({**common, "input": prompt, "max_output_tokens": max_tokens}).encode()
        messages = [{"role": "user", "content": prompt}]
        if self.api == "chat" and stream:
            common["stream_options"] = {"include_usage": True}
        return json.dumps({**common, "messages": messages, "max_tokens": max_tokens}).encode()

    def request(self, model: str, prompt: str, stream: bool, max_tokens: int) -> tuple[int, int, float]:
        """(completion tokens, pieces read, seconds to the first piece or to the answer)."""
        headers = {"Content-Type": "application/json"}
        if self.api == "messages":
            headers["anthropic-version"] = "2023-06-01"
        t0 = time.perf_counter()
        self.conn.request("POST", _PATHS[self.api], self.body(model, prompt, stream, max_tokens), headers)
        resp = self.conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        pieces: list[bytes] = []
        first = 0.0
        while piece := resp.read1(1 << 16):
            if not first:
                first = time.perf_counter() - t0
            pieces.append(piece)
        reads = len(pieces)
        pieces.append(resp.read())  # b"", and the response is closed: the connection can go on
        whole = b"".join(pieces)
        counts = _USAGE[self.api].findall(whole)
        tokens = int(counts[-1]) if counts else 0
        return tokens, reads if stream else 0, first if stream else time.perf_counter() - t0
