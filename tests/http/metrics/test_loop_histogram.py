"""The loop-owned histogram exposes what prometheus_client's Histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from rillet.http.metrics.loop_histogram import LoopHistogram


def test_same_exposition_as_prometheus_client() -> None:
    buckets = (0.01, 0.1, 1.0)
    values = [0.005, 0.01, 0.05, 0.5, 2.0, 0.1]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = LoopHistogram("lat_seconds", "latency", buckets)
    ours.register(h)
    ref = Histogram("lat_seconds", "latency", buckets=buckets, registry=theirs)
    for v in values:
        h.observe(v)
        ref.observe(v)
    assert h.count == len(values)

    def lines(reg: CollectorRegistry) -> list[str]:
        text = generate_latest(reg).decode()
        return sorted(x for x in text.splitlines() if x.startswith("lat_seconds_") and "created" not in x)

    assert lines(ours) == lines(theirs)
