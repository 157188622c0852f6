"""A test double of `rillet.core.engine.Engine`: same API, a thread that emits deterministic tokens.

Tokens are bytes (id = byte value, 256 = EOS): greedy output cycles through `TEXT` from an offset
set by the prompt length; a seed shifts that offset, so seeded sampling is reproducible and
different seeds differ. KV blocks are counted like the real pool (ceil(tokens / block_size) per
running sequence), so tests can check that aborted requests give their blocks back.

The engine (queue, admission, steps, aborts, deadlines, injected faults) is here; its tokenizer
and its sequences' token script are in tests/support/http_doubles/ (byte_tokenizer.py,
fake_sequences.py), their names re-exported.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from http_doubles.byte_tokenizer import BOOM_MARKER, EOS, FakeTokenizer
from http_doubles.fake_sequences import TEXT, FakeSeq
from rillet.core.config import RilletConfig
from rillet.core.engine.block_manager import PrefixFlush
from rillet.core.engine.inbox import NewEmbedding, NewRequest
from rillet.core.errors import EngineDeadError, ErrorKind, QueueFullError, RequestError
from rillet.core.outputs import SeqDelta, StepOutput
from rillet.core.ring import RingClosed, SpscRing
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason
from rillet.core.vision.front import VisionFront

__all__ = ["BOOM_MARKER", "EOS", "FAIL_MARKER", "TEXT", "FakeEngine", "FakeSeq", "FakeStats", "FakeTokenizer"]

FAIL_MARKER = "__fail__"  # a prompt holding this ends with FinishReason.ERROR after 3 tokens


@dataclass(frozen=True)
class FakeStats:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    steps: int
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    cached_blocks: int
    busy_seconds: float = 0.0
    kv_tokens_total: int = 0
    handoff_timeouts: int = 0
    device_wait_seconds: float = 0.0
    preemptions: int = 0
    deterministic: bool = False


class FakeEngine:
    def __init__(
        self, cfg: RilletConfig, step_ms: float = 2.0, max_model_len: int = 1024, num_blocks: int = 4096
    ) -> None:
        self.cfg = cfg
        self.tokenizer = FakeTokenizer()
        self.model_name = "fake-model"
        self.model_path = "/models/fake-model.gguf"  # the routers' worker API (http/worker/)
        self.model_type = "llama"
        self.flushes = 0  # tests: flush_prefix_cache calls
        self.max_model_len = max_model_len
        self.step_s = step_ms / 1000.0
        self.ring: SpscRing[StepOutput] = SpscRing(cfg.stream.ring_capacity)
        self.block_size = cfg.cache.block_size
        self.num_blocks = num_blocks
        self.error: str | None = None
        self.tasks = frozenset({"generate"})  # a chat model: /v1/embeddings answers 400
        self.embedding_size: int | None = None
        self.vision: VisionFront | None = None  # a text model: image parts answer 400
        self.crash_next_step = False  # tests: kill the engine thread
        self.reply: bytes | None = None  # tests: every sequence answers this, one byte a token, then EOS
        self.steps_allowed = threading.Event()  # tests: clear it to hold the engine before its next step
        self.steps_allowed.set()
        self.fail_request_ids: set[str] = set()  # tests: these requests end with FinishReason.ERROR
        self.priorities: list[int] = []  # tests: each added request's `priority`, in order
        self._dead = False
        self._stop = False
        self._inbox: deque[tuple[str, Any]] = deque()
        self._wake = threading.Event()
        self._waiting: list[list[FakeSeq]] = []
        self._running: dict[str, list[FakeSeq]] = {}
        self._pending_adds = 0
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.generated = 0
        self.prompt_tokens = 0

    @property
    def healthy(self) -> bool:
        return not self._dead

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop = True
        self.steps_allowed.set()
        self.ring.close()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int = 1,
        deadline: float | None = None,
    ) -> None:
        self.add_requests([NewRequest(request_id, prompt_ids, params, n, deadline)])

    def add_requests(self, requests: Sequence[NewRequest]) -> None:
        """As the engine's: every request checked, then the queue's room; all queued or none."""
        made = [self._seqs(r) for r in requests]
        if len(self._waiting) + self._pending_adds + len(made) > self.cfg.scheduler.max_waiting:
            raise QueueFullError(f"waiting queue is full ({self.cfg.scheduler.max_waiting})")
        self._pending_adds += len(made)
        self._inbox.append(("add", made))  # one item: one drain takes them all, as the engine's
        self._wake.set()

    def _seqs(self, r: NewRequest) -> list[FakeSeq]:
        prompt_ids, params = r.prompt_ids, r.params
        if self._dead:
            raise EngineDeadError(self.error or "dead")
        if r.lora is not None:
            raise RequestError("model", "the fake engine serves no LoRA adapters")
        if not prompt_ids:
            raise RequestError("prompt", "must contain at least one token")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise RequestError("prompt", "too long")
        self.priorities.append(r.priority)
        seqs = []
        for i in range(r.n):
            seed = None if params.seed is None else params.seed + i
            if params.greedy:
                offset = len(prompt_ids)
            else:
                offset = (
                    random.Random(seed).randrange(len(TEXT)) if seed is not None else random.randrange(99)
                )
            fail = 3 if FAIL_MARKER.encode() in bytes(t for t in prompt_ids if t < 256) else None
            seqs.append(FakeSeq(r.request_id, i, len(prompt_ids), params, r.deadline, offset, fail))
        return seqs

    def add_embeddings(self, inputs: Sequence[NewEmbedding]) -> None:
        raise RequestError("model", "the fake engine does not embed")

    def abort(self, request_id: str) -> None:
        self._inbox.append(("abort", request_id))
        self._wake.set()

    def flush_prefix_cache(self) -> Future[PrefixFlush]:
        """The fake caches no prefix: nothing to forget, nothing kept."""
        if self._dead:
            raise EngineDeadError(self.error or "dead")
        self.flushes += 1
        done: Future[PrefixFlush] = Future()
        done.set_result(PrefixFlush(0, 0))
        return done

    def stats(self) -> FakeStats:
        used = sum(self._blocks(s) for g in list(self._running.values()) for s in g if s.emitted >= 0)
        return FakeStats(
            running=sum(len(g) for g in list(self._running.values())),
            waiting=len(self._waiting) + self._pending_adds,
            kv_blocks_used=used,
            kv_blocks_total=self.num_blocks,
            kv_tokens_total=self.num_blocks * self.block_size,
            steps=self.steps,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=0,
            generated_tokens=self.generated,
            cached_blocks=0,
        )

    def _blocks(self, s: FakeSeq) -> int:
        return -(-(s.prompt_len + len(s.out)) // self.block_size)

    # ---- engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                deltas = self._drain()
                if not self._running and not self._waiting and not deltas:
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                if self.crash_next_step:
                    raise RuntimeError("injected engine crash")
                self._admit()
                if self._running:
                    self.steps_allowed.wait()
                    self.steps += 1
                    time.sleep(self.step_s)
                    deltas += self._step()
                if deltas:
                    self.ring.push(StepOutput(self.steps, deltas))
        except RingClosed:
            pass
        except BaseException as exc:
            self.error = f"engine thread died: {exc}"
            self._dead = True

    def _drain(self) -> list[SeqDelta]:
        deltas: list[SeqDelta] = []
        while self._inbox:
            kind, item = self._inbox.popleft()
            if kind == "add":
                self._waiting.extend(item)
                self._pending_adds -= len(item)
            else:
                deltas += self._end(item, FinishReason.ABORT, None)
        return deltas

    def _admit(self) -> None:
        limit = self.cfg.scheduler.max_num_seqs
        while self._waiting and sum(len(g) for g in self._running.values()) + len(self._waiting[0]) <= limit:
            group = self._waiting.pop(0)
            self._running[group[0].request_id] = group
            self.prompt_tokens += group[0].prompt_len

    def _end(
        self, request_id: str, reason: FinishReason, error: str | None, kind: ErrorKind | None = None
    ) -> list[SeqDelta]:
        group = self._running.pop(request_id, None)
        if group is None:
            for g in self._waiting:
                if g[0].request_id == request_id:
                    self._waiting.remove(g)
                    group = g
                    break
        return [s.delta([], "", None, reason, error, kind) for s in group or [] if s.emitted >= 0]

    def _step(self) -> list[SeqDelta]:
        deltas: list[SeqDelta] = []
        now = time.monotonic()
        for rid, group in list(self._running.items()):
            if rid in self.fail_request_ids or len(group[0].out) == group[0].fail_after:
                deltas += self._end(rid, FinishReason.ERROR, "injected fault", ErrorKind.MODEL)
                continue
            if group[0].deadline is not None and now > group[0].deadline:
                deltas += self._end(rid, FinishReason.ERROR, "request deadline exceeded", ErrorKind.DEADLINE)
                continue
            live = [s for s in group if s.emitted >= 0]
            for s in live:
                deltas.append(self._next(s))
            if all(s.emitted < 0 for s in group):
                del self._running[rid]
        return deltas

    def _next(self, s: FakeSeq) -> SeqDelta:
        self.generated += 1
        return s.next_delta() if self.reply is None else s.scripted(self.reply)
