"""GET /v1/responses/{id}/input_items: a stored response's input as Responses items, a page at a
time (`limit` 1-100, default 20; `order` desc (default) or asc; `after` an item id), in OpenAI's
list object (`data`, `first_id`, `last_id`, `has_more`).

The items are the request's own `input` (an earlier response's, reached by `previous_response_id`,
are that response's), each with an `id` (the one it came with, else a new one) and `status`
`completed`; a string input is one user message of one `input_text` part. Built from the input
after the request parsed it, so every item here is of a kind items.py accepts.
"""

from __future__ import annotations

from typing import Any

from rillet.http.openai.errors import bad_request
from rillet.http.responses.bodies import new_id

_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
MAX_LIMIT = 100


def input_items(value: Any) -> list[dict[str, Any]]:
    """The parsed request's `input` (a string or a list of item objects) as listed items."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    return [_listed(item) for item in value]


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    out = {"id": item.get("id") or new_id(_PREFIX.get(kind, "item")), **item, "type": kind}
    out.setdefault("status", "completed")
    if kind == "message" and isinstance(out.get("content"), str):
        part = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": part, "text": out["content"]}]
    return out


def page(items: list[dict[str, Any]], query: Any) -> dict[str, Any]:
    """One page of `items` by the request's query (a mapping of strings), or a 400 naming the field."""
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"'order' must be asc or desc, got {order!r}", param="order")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise bad_request(f"'after' names no input item of this response: {after!r}", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise bad_request(f"'limit' must be an integer in [1, {MAX_LIMIT}], got {value!r}", param="limit")
    return int(value)
