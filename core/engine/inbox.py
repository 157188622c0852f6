"""What other threads hand the engine thread: new requests, aborts and calls (work on the engine's
own state, such as emptying the prefix cache), taken in one drain at the top of every step.

Any thread puts (the event loop, the offline API); only the engine thread drains. A deque's
append and popleft are atomic under the GIL, so there is no lock: a request is one item, and the
requests of one `put` (Engine.add_requests) are one item too, so a drain takes all of them or
none, and the step after it schedules them together. `added` and `taken` count requests; the
difference is what is queued and not yet in the scheduler.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, TypeVar

from rillet.core.sampling_params import SamplingParams

if TYPE_CHECKING:  # NewRequest is the HTTP layer's too, which must not import the engine's modules
    from rillet.core.engine.core import EngineCore
    from rillet.core.outputs import SeqDelta
    from rillet.core.sequence import Seq

log = logging.getLogger(__name__)
T = TypeVar("T")


class NewRequest(NamedTuple):
    """One request of `Engine.add_requests` (the arguments of `add_request`)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    deadline: float | None = None
    lora: str | None = None
    priority: int = 0  # lower first under scheduler.policy priority; fcfs refuses any other than 0
    mm: object | None = None  # a vision model's image payload (core/vision/front.py MultimodalPrompt.mm)


class NewEmbedding(NamedTuple):
    """One input of `Engine.add_embeddings` (the arguments of `add_embedding`)."""

    request_id: str
    prompt_ids: list[int]
    dimensions: int | None = None
    deadline: float | None = None


class _Call:
    """`fn(core)` to run on the engine thread, between steps; its result (or error) in `future`."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[EngineCore], Any]) -> None:
        self.fn = fn
        self.future: Future[Any] = Future()

    def run(self, core: EngineCore) -> None:
        if not self.future.set_running_or_notify_cancel():
            return  # the caller gave up waiting
        try:
            self.future.set_result(self.fn(core))
        except Exception as exc:  # the caller's to report; the engine goes on
            self.future.set_exception(exc)


# A new request's sequences, several requests' (one put), the id of a request to abort, or a call.
_Item: TypeAlias = "list[Seq] | tuple[list[Seq], ...] | str | _Call"


class Inbox:
    def __init__(self, wake: threading.Event) -> None:
        self._items: deque[_Item] = deque()
        self._wake = wake  # set on every put: the engine thread may be idle
        self.added = 0  # requests put
        self.taken = 0  # requests drained into the engine core

    @property
    def queued(self) -> int:
        """Requests put and not drained yet."""
        return self.added - self.taken

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(self, requests: list[list[Seq]]) -> None:
        """Each request's sequences; all of them are taken by one drain."""
        self.added += len(requests)
        self._items.append(requests[0] if len(requests) == 1 else tuple(requests))
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._items.append(request_id)
        self._wake.set()

    def call(self, fn: Callable[[EngineCore], T]) -> Future[T]:
        """Runs `fn(core)` on the engine thread at its next drain, in order with the requests and
        aborts put before it: the core's state is the engine thread's alone, so this is the one
        safe way for another thread to change it."""
        item = _Call(fn)
        self._items.append(item)
        self._wake.set()
        return item.future

    def cancel_calls(self, reason: str) -> None:
        """The engine thread is gone: calls still queued fail rather than leave their callers
        waiting forever."""
        for item in list(self._items):
            if isinstance(item, _Call) and item.future.set_running_or_notify_cancel():
                item.future.set_exception(RuntimeError(reason))

    def drain(self, core: EngineCore) -> list[SeqDelta]:
        """On the engine thread: everything put so far into `core`, in order; the deltas of
        aborts and of requests the core refused."""
        deltas: list[SeqDelta] = []
        items = self._items
        while items:
            item = items.popleft()
            if isinstance(item, str):
                deltas.extend(core.abort(item))
                continue
            if isinstance(item, _Call):
                item.run(core)
                continue
            for seqs in item if isinstance(item, tuple) else (item,):
                try:
                    core.add(seqs)
                except Exception as exc:  # one bad request must not take the engine down
                    log.exception("request %s could not be added", seqs[0].request_id)
                    deltas.extend(core.reject(seqs, f"{type(exc).__name__}: {exc}"))
                finally:
                    self.taken += 1
        return deltas
