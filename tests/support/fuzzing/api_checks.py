"""The checks on /v1/responses and /v1/messages answers: Anthropic's error shape (every 4xx on
/v1/messages), well-formed Response and Message objects, and SSE streams of named events that end as
their API ends one, with no error event. Client.check (fuzzing/client.py) applies them.
"""

from __future__ import annotations

from typing import Any

import orjson


def is_anthropic_error(body: Any) -> bool:
    if not isinstance(body, dict) or set(body) != {"type", "error"} or body["type"] != "error":
        return False
    err = body["error"]
    return (
        isinstance(err, dict)
        and set(err) == {"type", "message"}
        and isinstance(err["type"], str)
        and isinstance(err["message"], str)
        and bool(err["message"])
    )


def named_events(data: bytes, context: str) -> list[tuple[str, Any]]:
    out = []
    for block in data.split(b"\n\n"):
        if not block.strip():
            continue
        head, _, payload = block.partition(b"\ndata: ")
        assert head.startswith(b"event: ") and payload, context
        event = orjson.loads(payload)
        assert event["type"] == head[7:].decode(), context
        out.append((event["type"], event))
    return out


def check_response(r: Any, context: str) -> None:
    assert r["object"] == "response" and r["status"] in ("completed", "incomplete"), context
    assert r["output"] and all(o["type"] in ("message", "function_call") for o in r["output"]), context
    usage = r["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], context


def check_response_events(events: list[tuple[str, Any]], context: str) -> None:
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], context
    assert kinds[-1] in ("response.completed", "response.incomplete"), context
    assert "error" not in kinds and "response.failed" not in kinds, context
    assert [e["sequence_number"] for _, e in events] == list(range(len(events))), context
    check_response(events[-1][1]["response"], context)


def check_message(m: Any, context: str) -> None:
    assert m["type"] == "message" and m["role"] == "assistant" and m["content"], context
    assert m["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), context
    assert all(b["type"] in ("text", "tool_use") for b in m["content"]), context


def check_message_events(events: list[tuple[str, Any]], context: str) -> None:
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], context
    assert "error" not in kinds, context
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1, context
