"""Sends the engine's KV-cache events from a thread of its own, as vLLM's ZmqEventPublisher does.

Each engine step's events are one batch, packed with msgpack as vLLM's KVEventBatch (array_like:
[ts, events, data_parallel_rank]) and sent as three frames: [topic, sequence number as 8 bytes
big-endian, payload]. With kv_events.replay_endpoint set, a ROUTER socket answers a request
[start sequence as 8 bytes big-endian] with every buffered batch from it, then [-1, b""].

The engine thread only appends to a bounded queue: when the sender falls kv_events.max_queue_size
batches behind, a batch is dropped and counted, never waited for. Its sequence number is spent all
the same, so a subscriber sees the gap.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections import deque
from typing import Any

from rillet.core.config.kv_events import KVEventsConfig

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.1


def binds(endpoint: str) -> bool:
    """vLLM's rule: a wildcard or a local transport is bound, a host:port is connected to (llm-d's
    indexer binds one endpoint that every engine connects to)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    def __init__(self, cfg: KVEventsConfig) -> None:
        import msgpack
        import zmq

        self._packb = msgpack.packb
        self._zmq = zmq
        self._queue: queue.Queue[tuple[int, float, list[Any]] | None] = queue.Queue(cfg.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._seqs = itertools.count()
        self._topic = cfg.topic.encode()
        self.dropped = 0  # batches the sender could not keep up with
        self.last_seq = -1  # the sequence number of the last batch handed over (sent or dropped)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pub: zmq.Socket[bytes] = ctx.socket(zmq.PUB)
        self._pub.set_hwm(cfg.hwm)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            if binds(cfg.endpoint):
                self._pub.bind(cfg.endpoint)
            else:
                self._pub.connect(cfg.endpoint)
            if cfg.replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.bind(cfg.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._run, name="rillet-kv-events", daemon=True)
        self._thread.start()

    # ---- the engine thread -------------------------------------------------------------------
    def publish(self, events: list[Any]) -> None:
        """One step's events; never blocks."""
        seq = self.last_seq = next(self._seqs)
        try:
            self._queue.put_nowait((seq, time.time(), events))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("kv events: %d batches dropped (the sender is behind)", self.dropped)

    def close(self, timeout: float = 2.0) -> None:
        """Sends what is queued (for up to `timeout` seconds), then closes the sockets."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        if self._thread.is_alive():  # stuck in a send: its sockets are still in use
            log.warning("kv events: the sender did not stop within %g s", timeout)
            return
        self._close_sockets()

    # ---- the sender thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is None:
                return
            seq, ts, events = item
            try:
                self._send(seq, ts, events)
            except Exception:  # a bad batch is lost, not the publisher
                log.exception("kv events: batch %d not sent", seq)

    def _send(self, seq: int, ts: float, events: list[Any]) -> None:
        # data_parallel_rank 0, never omitted: llm-d's decoder wants the three elements
        payload = self._packb([ts, events, 0])
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        assert self._replay is not None
        try:
            frames = self._replay.recv_multipart(self._zmq.NOBLOCK)
        except self._zmq.Again:
            return
        if len(frames) != 3:
            log.warning("kv events: bad replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
