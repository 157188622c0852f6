"""A long text is encoded with the GIL released: other Python threads (the engine's step
preparation, the event loop's writes) run while it is tokenized. Ids equal to transformers' for
such texts: test_tokenizer_transformers.py (TEXTS holds one past the threshold)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from rillet.core.tokenizer.tokenizer import GIL_FREE_CHARS, Tokenizer

LONG = "A keeper of the lighthouse wrote each night what the sea had brought. " * 300  # ~4,500 tokens


def _python_runs_during(call: Callable[[], object]) -> int:
    """How many iterations another Python thread made while `call` ran (5 calls)."""
    count = [0]
    stop = threading.Event()
    started = threading.Event()

    def tick() -> None:
        started.set()
        while not stop.is_set():
            count[0] += 1

    th = threading.Thread(target=tick)
    th.start()
    started.wait(10)
    during = 0
    try:
        for _ in range(5):
            before = count[0]
            call()
            during += count[0] - before
    finally:
        stop.set()
        th.join()
    return during


def test_a_long_text_lets_other_threads_run(ours: Tokenizer) -> None:
    assert len(LONG) >= GIL_FREE_CHARS
    want = ours._backend.encode(LONG).ids
    assert ours.encode(LONG) == want
    assert _python_runs_during(lambda: ours.encode(LONG)) > 0
