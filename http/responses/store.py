"""The store of finished responses (`store: true`): bounded in count (`responses.store_size`), each
entry living `responses.store_ttl_s`; the oldest goes first. Kept on the event loop only (no lock).

An entry holds the response object (GET /v1/responses/{id} answers it), the request's input items
(GET /v1/responses/{id}/input_items) and the conversation up to and including that answer, in chat
shape (`previous_response_id` continues it; the prefix cache then finds the earlier turns' KV
blocks, so a continued conversation prefills only its new turn). A vision model's conversation
keeps its decoded images (they are part of the prompt a continuation rebuilds).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Stored:
    response: dict[str, Any]
    messages: list[dict[str, Any]]
    expires: float
    size: int  # the conversation's bytes as JSON: how much a request continuing it parses
    inputs: list[dict[str, Any]]  # the request's input items (GET .../input_items)


def _no_bytes(_: object) -> None:
    """A decoded image in the conversation (chat_messages.py's image entry) counts as no text."""
    return None


class ResponseStore:
    def __init__(self, size: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._size = size
        self._ttl = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, Stored] = OrderedDict()  # insertion order = expiry order

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        rid: str,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        inputs: list[dict[str, Any]] | None = None,
    ) -> None:
        if self._size == 0:
            return
        now = self._clock()
        self._expire(now)
        size = len(orjson.dumps(messages, default=_no_bytes))
        self._entries[rid] = Stored(response, messages, now + self._ttl, size, inputs or [])
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        self._expire(self._clock())
        return self._entries.get(rid)

    def delete(self, rid: str) -> bool:
        self._expire(self._clock())
        return self._entries.pop(rid, None) is not None

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            rid, first = next(iter(entries.items()))
            if first.expires > now:
                return
            del entries[rid]
