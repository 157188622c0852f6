"""KV-cache events end to end: a real tiny engine publishes over ZMQ to a SUB socket bound the way
llm-d's indexer binds one (the engine connects); the index rebuilt from the decoded events alone
equals the block manager's after waves of requests sharing prefixes in a pool that evicts, and the
prefix hits llm-d's scorer would predict from it equal the hits the server finds."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from core_helpers.kv_event_index import EventIndex
from rillet.core.config import config_from_dict
from rillet.core.engine.kv_events.hashing import BlockHasher
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq

BS = 8
TOPIC = "kv@pod-a@tiny-llama"  # llm-d's kv@<pod-id>@<model-name>
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


def _drain(sub: zmq.Socket[bytes], index: EventIndex, seen: list[int], until: int, replay: str) -> None:
    """Applies batches in sequence order until the one numbered `until`, as a consumer does: a gap
    (ZMQ's PUB drops what it sends before a subscriber has joined) is filled from the replay socket."""
    deadline = time.monotonic() + 10
    while len(seen) <= until and time.monotonic() < deadline:
        if not sub.poll(200):  # nothing live: what is missing comes from the buffer
            _apply(index, seen, _replay(replay, len(seen)), until + 1)
            continue
        topic, seq, payload = sub.recv_multipart()
        assert topic == TOPIC.encode() and len(seq) == 8
        n = int.from_bytes(seq, "big")
        if n > len(seen):
            _apply(index, seen, _replay(replay, len(seen)), n)
        if n == len(seen):
            _apply(index, seen, [(n, payload)], n + 1)
    assert len(seen) == until + 1, f"batch {until} never arrived (got {seen[-1:]})"


def _apply(index: EventIndex, seen: list[int], batches: list[tuple[int, bytes]], stop: int) -> None:
    for n, payload in batches:
        if len(seen) <= n < stop:
            assert n == len(seen), "a batch is missing from the replay"
            seen.append(n)
            index.apply_payload(payload)


def _replay(endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """vLLM's replay protocol: [empty, start] to the ROUTER; each buffered batch from `start` comes
    back as [empty, seq, payload], then [empty, -1, b""]."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart((b"", start.to_bytes(8, "big")))
    got: list[tuple[int, bytes]] = []
    try:
        while dealer.poll(5000):
            _, seq, payload = dealer.recv_multipart()
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                return got
            got.append((n, payload))
        raise AssertionError("replay did not end")
    finally:
        dealer.close(linger=0)


def test_subscriber_index_equals_the_block_managers(tiny_hf_model: Any, tmp_path: Path) -> None:
    folder, _ = tiny_hf_model("llama")
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    replay = f"ipc://{tmp_path}/replay"
    cfg = config_from_dict(
        {
            "model": {"path": str(folder), "kind": "hf", "dtype": "float32", "device": "cpu"},
            "cache": {"block_size": BS, "num_blocks": 24},  # 23 usable: later waves evict
            "kv_events": {
                "enabled": True,
                "endpoint": f"tcp://127.0.0.1:{port}",
                "replay_endpoint": replay,
                "topic": TOPIC,
                "hash_seed": "42",
            },
        }
    )
    rng = random.Random(0)
    shared = [rng.randrange(3, 250) for _ in range(20)]
    index = EventIndex(BlockHasher("tiny-llama", "42"))
    seen: list[int] = []
    try:
        with LLM(cfg) as llm:
            core = llm.engine.core
            rec, pub = core.blocks.events, llm.engine.kv_events
            assert rec is not None and pub is not None
            for wave in range(5):
                prompts = [
                    shared[: 12 + 4 * i] + [rng.randrange(3, 250) for _ in range(17)] for i in range(3)
                ]
                llm.generate(prompts, GREEDY)
                assert llm.engine.wait_idle()
                time.sleep(0.05)  # the engine loop's next pass hands the last step's events over
                _drain(sub, index, seen, pub.publisher.last_seq, replay)
                server = {rec.hash_of(b) for b in core.blocks._key_of}
                assert index.hashes == server, f"wave {wave}"
                for p in prompts:  # llm-d's predicted hit blocks == the server's actual hits
                    keys = index.hasher.chain(p[:-1], BS)
                    predicted = next((i for i, k in enumerate(keys) if k not in index.hashes), len(keys))
                    probe = Seq(10**6, "probe", p, GREEDY)
                    assert predicted == len(core.blocks.match_prefix(probe))
            assert core.blocks.stats.evictions > 0 and index.removed > 0 and index.orphans == 0
            assert [n for n, _ in _replay(replay, 1)] == seen[1:]
    finally:
        sub.close(linger=0)


@pytest.mark.parametrize("endpoint", ["http://x:1", "tcp//x"])
def test_bad_endpoint_is_a_config_error(endpoint: str) -> None:
    from rillet.core.config import ConfigError

    with pytest.raises(ConfigError) as err:
        config_from_dict({"kv_events": {"enabled": True, "endpoint": endpoint}})
    assert err.value.key == "kv_events.endpoint"


def test_events_need_prefix_caching() -> None:
    from rillet.core.config import ConfigError

    with pytest.raises(ConfigError) as err:
        config_from_dict({"kv_events": {"enabled": True}, "cache": {"prefix_caching": False}})
    assert err.value.key == "kv_events.enabled"


def test_a_slow_sender_drops_and_counts_never_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine thread's publish never waits: with the sender stuck and its queue full, a batch is
    dropped and counted, and its sequence number is spent (a subscriber sees the gap)."""
    from rillet.core.config import KVEventsConfig
    from rillet.core.engine.kv_events.publisher import ZmqEventPublisher

    sending, release = threading.Event(), threading.Event()
    real = ZmqEventPublisher._send

    def stuck(self: ZmqEventPublisher, seq: int, ts: float, events: list[Any]) -> None:
        if seq == 0:
            sending.set()
            release.wait(10)
        real(self, seq, ts, events)

    monkeypatch.setattr(ZmqEventPublisher, "_send", stuck)
    cfg = KVEventsConfig(
        enabled=True, endpoint="inproc://kv-drop", replay_endpoint="inproc://kv-drop-replay", max_queue_size=1
    )
    pub = ZmqEventPublisher(cfg)
    try:
        pub.publish([["AllBlocksCleared"]])
        assert sending.wait(10)
        pub.publish([["AllBlocksCleared"]])  # queued
        pub.publish([["AllBlocksCleared"]])  # the queue is full: dropped
        assert pub.dropped == 1 and pub.last_seq == 2
        release.set()
        deadline = time.monotonic() + 10
        while len(got := _replay("inproc://kv-drop-replay", 0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [n for n, _ in got] == [0, 1]
    finally:
        release.set()
        pub.close()
