"""The span export thread's queue: batches of at most the batch size, a full queue drops rather than
waits, an exporter that raises does not stop later exports, and shutdown exports what is queued."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from rillet.http.observability.span_batcher import BatchTerms, SpanBatcher


def test_batches_drops_and_an_exporter_failure() -> None:
    batches: list[list[int]] = []

    def export(batch: Sequence[int]) -> None:
        batches.append(list(batch))
        if batch[0] == 0:
            raise RuntimeError("collector down")

    batcher: SpanBatcher[int] = SpanBatcher(export, BatchTerms(delay_s=60, max_queue=5, max_batch=2))
    for i in range(7):  # the thread may take the first full batch before the queue fills
        batcher.put(i)
    assert batcher.flush(10)
    sent = [i for b in batches for i in b]
    assert all(len(b) <= 2 for b in batches) and sent == sorted(sent) and sent[:2] == [0, 1]
    assert len(sent) + batcher.dropped == 7
    batcher.put(100)  # the failed batch did not end the thread
    batcher.shutdown(10)
    assert batches[-1] == [100]


def test_the_batch_terms_come_from_the_sdks_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "oops")
    assert BatchTerms.from_env() == BatchTerms(delay_s=0.25, max_queue=100, max_batch=100)
