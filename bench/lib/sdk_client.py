"""One request of the seed issue's measurement through the official SDKs: a greedy chat
completion (`openai`, /v1/chat/completions), response (`openai`, /v1/responses) or message
(`anthropic`, /v1/messages) of `max_tokens` tokens with ignore_eos, streamed or not, returning its
completion tokens (from `usage`), its chunks or events, and its time to the first content chunk or
to the answer; `make_clients` makes one client per concurrent request, the SDK's or RawClient
(raw_client.py: the same requests over http.client, the client's own CPU out of the comparison).
Used by bench/serving/stream_vs_nonstream.py and, through timed_batch.py, config_ab.py."""

from __future__ import annotations

import time
from typing import Any

import openai

from bench.lib.raw_client import RawClient

PROMPT = "What is the meaning of life?"


def one_request(
    client: Any, model: str, stream: bool, max_tokens: int, api: str = "chat"
) -> tuple[int, int, float]:
    """(completion tokens, chunks, seconds to first content chunk or to the answer)."""
    if isinstance(client, RawClient):
        return client.request(model, PROMPT, stream, max_tokens)
    if api == "responses":
        return _responses_request(client, model, stream, max_tokens)
    if api == "messages":
        return _messages_request(client, model, stream, max_tokens)
    t0 = time.perf_counter()
    common: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "extra_body": {"ignore_eos": True},
    }
    if not stream:
        answer = client.chat.completions.create(**common)
        assert answer.usage is not None
        return answer.usage.completion_tokens, 0, time.perf_counter() - t0
    tokens = chunks = content_chunks = 0
    ttft = 0.0
    for chunk in client.chat.completions.create(
        **common, stream=True, stream_options={"include_usage": True}
    ):
        chunks += 1
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        elif chunk.choices and chunk.choices[0].delta.content:
            content_chunks += 1
            if not ttft:
                ttft = time.perf_counter() - t0
    # A server without include_usage support (llama-cpp-python): count content chunks, as the
    # seed issue's script did (one token per chunk there).
    return tokens or content_chunks, chunks, ttft


def _responses_request(
    client: openai.OpenAI, model: str, stream: bool, max_tokens: int
) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    common: dict[str, Any] = {
        "model": model,
        "input": PROMPT,
        "max_output_tokens": max_tokens,
        "temperature": 0.0,
        "extra_body": {"ignore_eos": True},
    }
    if not stream:
        answer = client.responses.create(**common)
        assert answer.usage is not None
        return answer.usage.output_tokens, 0, time.perf_counter() - t0
    tokens = events = 0
    ttft = 0.0
    for event in client.responses.create(**common, stream=True):
        events += 1
        if event.type == "response.output_text.delta" and not ttft:
            ttft = time.perf_counter() - t0
        elif event.type in ("response.completed", "response.incomplete") and event.response.usage:
            tokens = event.response.usage.output_tokens
    return tokens, events, ttft


def _messages_request(client: Any, model: str, stream: bool, max_tokens: int) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    common: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "extra_body": {"temperature": 0.0, "ignore_eos": True},
    }
    if not stream:
        answer = client.messages.create(**common)
        return answer.usage.output_tokens, 0, time.perf_counter() - t0
    tokens = events = 0
    ttft = 0.0
    for event in client.messages.create(**common, stream=True):
        events += 1
        if event.type == "content_block_delta" and not ttft:
            ttft = time.perf_counter() - t0
        elif event.type == "message_delta":
            tokens = event.usage.output_tokens
    return tokens, events, ttft


def make_clients(base_url: str, api_key: str, api: str, n: int, raw: bool = False) -> list[Any]:
    if raw:
        return [RawClient(base_url, api) for _ in range(n)]
    if api == "messages":
        import anthropic

        root = base_url.removesuffix("/").removesuffix("/v1")
        return [
            anthropic.Anthropic(base_url=root, api_key=api_key, max_retries=0, timeout=600) for _ in range(n)
        ]
    return [openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600) for _ in range(n)]
