"""The engine: an `EngineCore` driven by its own thread, fed through a lock-free inbox.

Other threads (the event loop, the offline API) call `add_request` / `add_requests` / `abort`;
those check the request (core/engine/admission.py) and put it in the inbox (core/engine/inbox.py).
The engine thread drains the inbox at the top of every step, so an abort takes effect within one
step. Each step's deltas go out as one `StepOutput` through the SPSC ring (core/ring.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from rillet.core.config import RilletConfig
from rillet.core.engine.admission import Admission
from rillet.core.engine.core import EngineCore
from rillet.core.engine.handoff.gil_gate import EngineGate, resolve_gate
from rillet.core.engine.handoff.publisher import Publisher, resolve_handoff
from rillet.core.engine.inbox import Inbox, NewEmbedding, NewRequest
from rillet.core.engine.overlap import resolve_overlap
from rillet.core.engine.stats import EngineStats, collect_stats
from rillet.core.errors import (
    AdapterError,
    AdapterErrorKind,
    EngineDeadError,
    ErrorKind,
    QueueFullError,
)
from rillet.core.lora.registry import AdapterInfo
from rillet.core.outputs import StepOutput
from rillet.core.ring import RingClosed, SpscRing
from rillet.core.runtime import Runtime, load_runtime
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason
from rillet.core.structured.setup import attach_structured
from rillet.core.structured.spec import GrammarSpec
from rillet.core.thread_name import name_native_thread
from rillet.core.vision.front import VisionFront

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, cfg: RilletConfig, progress: Callable[[str, float], None] | None = None) -> None:
        self.cfg = cfg
        self.ring: SpscRing[StepOutput] = SpscRing(cfg.stream.ring_capacity)
        self._wake = threading.Event()
        self._inbox = Inbox(self._wake)
        self._go = threading.Event()
        self._stop = False
        self.error: str | None = None
        self._dead = False
        self._fatal: str | None = None  # set by fail(): the engine thread dies with it
        self._busy = 0.0
        # The model is built on the engine thread, which then runs it until shutdown: torch's CPU
        # thread pool is tied to the thread that first used it, and a model built on a thread
        # that later exits decoded ~3.5x slower (measured).
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._main, args=(progress,), name="rillet-engine", daemon=True
        )
        self._thread.start()
        self._loaded.wait()
        if self._load_error is not None:
            self._thread.join()
            self._thread = None
            raise self._load_error

    def _load(self, progress: Callable[[str, float], None] | None) -> None:
        rt: Runtime = load_runtime(self.cfg, progress)
        self.runtime = rt
        self.tokenizer = rt.tokenizer
        m, overlap = self.cfg.model, self.cfg.engine.overlap
        self.overlap, why = resolve_overlap(overlap, rt.device.type, m.kind, m.synthetic_async)
        if self.overlap and self.cfg.engine.overlap_depth > 1:
            why += f", {self.cfg.engine.overlap_depth} steps in flight (engine.overlap_depth)"
        log.info("engine overlap: %s", why)
        # a launch only enqueues the step: CUDA, and the null engine that models a device
        self.async_launch = rt.device.type == "cuda" or (m.kind == "synthetic" and m.synthetic_async)
        self.core = EngineCore(
            rt.scheduler,
            rt.runner,
            rt.make_detokenizer,
            rt.max_model_len,
            self.overlap,
            rt.speculator,
            serves_both=rt.tasks == {"generate", "embed"},
            overlap_depth=self.cfg.engine.overlap_depth,
        )
        grammars, no_grammar = None, "structured outputs need a generation model (model.task)"
        if "generate" in rt.tasks:
            vocab = rt.arch.vocab_size if rt.arch is not None else None
            grammars, no_grammar = attach_structured(self.cfg.structured, rt.tokenizer, rt.runner, vocab)
        priorities = self.cfg.scheduler.policy == "priority"
        self.admission = Admission(rt, grammars, no_grammar, priorities)
        a = self.admission  # what the HTTP layer and the offline API read of the model
        self.model_name, self.max_model_len, self.tasks = a.model_name, a.max_model_len, a.tasks
        self.lora, self.embedding_size, self.grammars = a.lora, a.embedding_size, a.grammars
        self.vocab_size = a.vocab_size
        # a vision-language model's image front end (core/vision/); None for a text model
        self.vision: VisionFront | None = None if rt.vision is None else rt.vision.front
        if rt.cluster is not None:
            rt.cluster.watch(self.fail)
        self.handoff_s = resolve_handoff(self.cfg, rt.device.type)
        state = "off" if self.handoff_s is None else f"on (<= {self.handoff_s * 1000:g} ms)"
        log.info("stream handoff: %s", state)
        self.core.gate, why = resolve_gate(self.cfg.stream, self.async_launch, self.hands_off)
        log.info("engine first (the event loop gives way to the engine's host work): %s", why)

    def _main(self, progress: Callable[[str, float], None] | None) -> None:
        name_native_thread(threading.current_thread().name)  # "rillet-engine" in top -H, /proc
        try:
            self._load(progress)
        except BaseException as exc:
            self._load_error = exc
            return
        finally:
            self._loaded.set()
        self._go.wait()
        try:
            if not self._stop:
                self._run()
        finally:
            if self.gate is not None:
                self.gate.open()
            self.runtime.runner.close()
            if self.runtime.speculator is not None:
                self.runtime.speculator.close()
            if self.runtime.cluster is not None:  # the other ranks stop with this thread
                self.runtime.cluster.close(graceful=not self._dead)

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._go.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self.ring.close()
        self._go.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def fail(self, reason: str) -> None:
        """From any thread: the engine cannot go on (e.g. a tensor-parallel rank died). The engine
        thread dies with `reason` before its next step, failing every open request."""
        self._fatal = reason
        self._wake.set()

    @property
    def hands_off(self) -> bool:
        """stream.handoff is on: each model run waits until the event loop has handled the last
        step's output (its ring release)."""
        return self.handoff_s is not None

    @property
    def gate(self) -> EngineGate | None:
        """stream.engine_first's gate (handoff/gil_gate.py), the event loop's side of it."""
        return self.core.gate

    @property
    def healthy(self) -> bool:
        return not self._dead

    @property
    def is_alive(self) -> bool:
        return self._go.is_set() and self._thread is not None and self._thread.is_alive()

    # ---- requests (any thread) ----------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int = 1,
        deadline: float | None = None,
        lora: str | None = None,
        priority: int = 0,
    ) -> None:
        """`lora`: the name of a loaded LoRA adapter (AdapterError NOT_FOUND if there is none);
        `priority`: lower runs first under scheduler.policy priority (0 only under fcfs)."""
        self.add_requests([NewRequest(request_id, prompt_ids, params, n, deadline, lora, priority)])

    def add_requests(self, requests: Sequence[NewRequest]) -> None:
        """Several requests queued as one: the engine thread takes them all before its next step,
        so they are scheduled together from their first step (one add_request after another may
        race a step in between). All or none: when one is refused, none is queued. Each is
        checked, then the queue's room, before any sequence (or grammar matcher) is made."""
        if not requests:
            return
        self._check_alive()
        adapters = [self.admission.check(r) for r in requests]
        self._check_room(len(requests))
        self._inbox.put([self.admission.make_seqs(r, a) for r, a in zip(requests, adapters, strict=True)])

    def _check_alive(self) -> None:
        if self._dead:
            raise EngineDeadError(self.error or "engine is not running")

    def _check_room(self, n: int) -> None:
        """QueueFullError unless the waiting queue has room for n more requests."""
        if self.core.num_waiting + self._inbox.queued + n > self.cfg.scheduler.max_waiting:
            raise QueueFullError(f"waiting queue is full ({self.cfg.scheduler.max_waiting})")

    def add_embedding(
        self,
        request_id: str,
        prompt_ids: list[int],
        dimensions: int | None = None,
        deadline: float | None = None,
    ) -> None:
        """One input of /v1/embeddings: a prompt-only sequence whose one delta carries its vector."""
        self.add_embeddings([NewEmbedding(request_id, prompt_ids, dimensions, deadline)])

    def add_embeddings(self, inputs: Sequence[NewEmbedding]) -> None:
        """A request's inputs queued as one, all or none (as add_requests): each checked, then the
        queue's room."""
        if not inputs:
            return
        self._check_alive()
        a = self.admission
        seqs = [a.embedding_seq(e.request_id, e.prompt_ids, e.dimensions, e.deadline) for e in inputs]
        self._check_room(len(seqs))
        self._inbox.put([[seq] for seq in seqs])

    # ---- LoRA adapters (any thread) -------------------------------------------------------------
    def lora_adapters(self) -> list[AdapterInfo]:
        return [] if self.lora is None else self.lora.infos()

    def load_lora(self, name: str, path: str) -> None:
        """Reads, checks and registers an adapter (lora.allow_runtime_updates); blocking file IO,
        so an event loop calls it on a worker thread. Raises AdapterError."""
        if self.lora is None:
            raise AdapterError(AdapterErrorKind.DISABLED, name, "this server serves no LoRA adapters (lora)")
        self.lora.load(name, path, reserved=self.model_name)

    def unload_lora(self, name: str) -> None:
        """New requests for `name` are refused from now on; running ones finish with it."""
        if self.lora is None:
            raise AdapterError(AdapterErrorKind.DISABLED, name, "this server serves no LoRA adapters (lora)")
        self.lora.unload(name)

    def abort(self, request_id: str) -> None:
        self._inbox.abort(request_id)

    def prepare_grammar(self, spec: GrammarSpec) -> None:
        """Compiles `spec` into the grammar cache (any thread; the HTTP layer runs it on a worker
        under `structured.compile_timeout_s`). Raises GrammarError (a ValueError) naming the field."""
        self.admission.prepare_grammar(spec)

    def stats(self) -> EngineStats:
        rt = self.runtime
        queued = self._inbox.queued
        return collect_stats(self.core, queued, self._busy, self.ring, rt.timeline, rt.deterministic)

    # ---- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        publisher = Publisher(self.ring, self.handoff_s, self.async_launch)
        poll = self.runtime.runner.poll  # work that must run on this thread, between steps
        try:
            while not self._stop:
                poll()
                if self._fatal is not None:
                    raise RuntimeError(self._fatal)
                aborted = self._drain_inbox()
                if not self.core.has_work() and not aborted:
                    publisher.flush()
                    self._idle(0.1)
                    continue
                t0 = time.perf_counter()
                out = self.core.step(publisher.before_run, publisher.after_launch)
                publisher.flush()  # neither hook was called if nothing was scheduled
                if out is None and not aborted:
                    # work, none of it runnable now (embeddings waiting out chat's share): no spin
                    self._idle(0.001)
                if aborted:
                    step = out.step if out is not None else self.core.steps
                    out = StepOutput(step, aborted.deltas + (out.deltas if out else []))
                if out is not None and out.deltas:
                    publisher.hold(out)
                if not self.core.has_work():
                    publisher.flush()
                self._busy += time.perf_counter() - t0
        except RingClosed:
            pass
        except BaseException as exc:
            if self.gate is not None:
                self.gate.open()
            self.error = f"engine thread died: {type(exc).__name__}: {exc}"
            log.exception("engine thread died")
            self._dead = True
            publisher.salvage()  # tokens already produced go out before the failures
            self._fail_everything()
            raise

    def _idle(self, timeout: float) -> None:
        gate = self.gate
        if gate is not None:
            gate.waiting()
        self._wake.wait(timeout)
        self._wake.clear()
        if gate is not None:
            gate.working()

    def _drain_inbox(self) -> StepOutput | None:
        deltas = self._inbox.drain(self.core)
        return StepOutput(self.core.steps, deltas) if deltas else None

    def _fail_everything(self) -> None:
        """After a crash: tell every live request, so no client waits forever."""
        deltas = []
        for rid in list(self.core.seqs):
            try:
                deltas.extend(self.core.abort(rid, FinishReason.ERROR, self.error, ErrorKind.ENGINE_DEAD))
            except Exception:
                log.exception("while failing request %s", rid)
        if deltas:
            with contextlib.suppress(TimeoutError, RingClosed):
                self.ring.push(StepOutput(self.core.steps, deltas), timeout=1.0)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """True once no request is queued, running or in the inbox (for tests and draining)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._inbox and not self.core.has_work() and not self._inbox.queued:
                return True
            time.sleep(0.005)
        return False
