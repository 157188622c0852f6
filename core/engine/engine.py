"""The engine: an `EngineCore` driven by its own thread, fed through a lock-free inbox.

Other threads (the event loop, the offline API) call `add_request` / `add_requests` / `abort`;
those check the request here and put it in the inbox (core/engine/inbox.py). The engine thread
drains the inbox at the top of every step, so an abort takes effect within one step. Each step's
deltas go out as one `StepOutput` through the SPSC ring (core/ring.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rillet.core.config import RilletConfig
from rillet.core.embedding import EmbedParams
from rillet.core.engine.core import EngineCore
from rillet.core.engine.inbox import Inbox, NewRequest
from rillet.core.engine.overlap import resolve_overlap
from rillet.core.engine.publisher import Publisher
from rillet.core.errors import (
    AdapterError,
    AdapterErrorKind,
    EngineDeadError,
    ErrorKind,
    QueueFullError,
    RequestError,
)
from rillet.core.lora.adapter import LoraAdapter
from rillet.core.lora.registry import AdapterInfo
from rillet.core.outputs import StepOutput
from rillet.core.ring import RingClosed, SpscRing
from rillet.core.runtime import Runtime, load_runtime
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, Seq
from rillet.core.structured.compiler import GrammarCompiler
from rillet.core.structured.setup import attach_structured
from rillet.core.structured.spec import GrammarSpec, GrammarUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    steps: int
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    cached_blocks: int
    busy_seconds: float = 0.0  # wall time spent inside engine steps (incl. publishing)
    ring_wakeups: int = 0
    ring_full_waits: int = 0
    handoff_timeouts: int = 0  # model runs started after waiting stream.handoff_timeout_ms for the loop
    handoff_wait_seconds: float = 0.0  # of busy_seconds: waiting for the loop to take the last step
    device_wait_seconds: float = 0.0  # of busy_seconds: blocked waiting for launched steps' tokens
    spec_drafted: int = 0  # speculative decoding: draft tokens verified
    spec_accepted: int = 0  # ... of them accepted
    spec_verified: int = 0  # sequence-steps that verified a draft (each also gains the model's token)
    kv_tokens_total: int = 0  # tokens the pool holds: kv_blocks_total x block_size (cache.dtype sizes it)


# An embedding sequence's: one step's worth of "output" (its vector), never sampled
_EMBED_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)


def resolve_handoff(cfg: RilletConfig, device_type: str) -> float | None:
    """Seconds the engine may wait for the consumer before a model run (None = it never waits)."""
    mode = cfg.stream.handoff
    if mode == "auto":
        mode = "on" if device_type == "cpu" and cfg.model.kind != "synthetic" else "off"
    return cfg.stream.handoff_timeout_ms / 1000 if mode == "on" else None


class Engine:
    def __init__(self, cfg: RilletConfig, progress: Callable[[str, float], None] | None = None) -> None:
        self.cfg = cfg
        self.ring: SpscRing[StepOutput] = SpscRing(cfg.stream.ring_capacity)
        self._wake = threading.Event()
        self._inbox = Inbox(self._wake)
        self._go = threading.Event()
        self._stop = False
        self._seq_ids = itertools.count()
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
        self.model_name = rt.model_name
        self.max_model_len = rt.max_model_len
        m, overlap = self.cfg.model, self.cfg.engine.overlap
        self.overlap, why = resolve_overlap(overlap, rt.device.type, m.kind, m.synthetic_async)
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
        )
        self.tasks = rt.tasks
        self.lora = rt.lora  # LoRA adapters by name (None: the model serves none)
        self.embedding_size = rt.embedding_size  # components of a vector; None: no embeddings
        self._embed_every_token = rt.pooling is not None and rt.pooling.every_token
        self._embed_whole = rt.encoder
        vocab = rt.arch.vocab_size if rt.arch is not None else None
        self.vocab_size: int | None = vocab or getattr(rt.tokenizer, "vocab_size", None)
        self.grammars: GrammarCompiler | None = None
        self._no_grammar = "structured outputs need a generation model (model.task)"
        if "generate" in self.tasks:
            self.grammars, self._no_grammar = attach_structured(
                self.cfg.structured, rt.tokenizer, rt.runner, vocab
            )
        if rt.cluster is not None:
            rt.cluster.watch(self.fail)
        self.handoff_s = resolve_handoff(self.cfg, rt.device.type)
        state = "off" if self.handoff_s is None else f"on (<= {self.handoff_s * 1000:g} ms)"
        log.info("stream handoff: %s", state)

    def _main(self, progress: Callable[[str, float], None] | None) -> None:
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
    ) -> None:
        """`lora`: the name of a loaded LoRA adapter (AdapterError NOT_FOUND if there is none)."""
        self.add_requests([NewRequest(request_id, prompt_ids, params, n, deadline, lora)])

    def add_requests(self, requests: Sequence[NewRequest]) -> None:
        """Several requests queued as one: the engine thread takes them all before its next step,
        so they are scheduled together from their first step (one add_request after another may
        race a step in between). All or none: when one is refused, none is queued. Each is
        checked, then the queue's room, before any sequence (or grammar matcher) is made."""
        if not requests:
            return
        adapters = [self._check(r) for r in requests]
        self._check_room(len(requests))
        made = []
        for r, adapter in zip(requests, adapters, strict=True):
            seqs = self._make_seqs(r.request_id, r.prompt_ids, r.params, r.n, r.deadline)
            for seq in seqs:
                seq.lora = adapter
            made.append(seqs)
        self._inbox.put(made)

    def _check(self, r: NewRequest) -> LoraAdapter | None:
        """Raises the error that refuses r; its LoRA adapter otherwise."""
        if self._dead:
            raise EngineDeadError(self.error or "engine is not running")
        adapter = self._adapter(r.lora) if r.lora is not None else None
        if "generate" not in self.tasks:
            raise RequestError("model", f"{self.model_name} is an embedding model (model.task: embed)")
        prompt_ids, params = r.prompt_ids, r.params
        if not prompt_ids:
            raise RequestError("prompt", "must contain at least one token")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise RequestError(
                "prompt",
                f"{len(prompt_ids)} prompt tokens + max_tokens {params.max_tokens} exceed the "
                f"context length {self.max_model_len}",
            )
        if params.logit_bias and self.vocab_size and params.logit_bias[-1][0] >= self.vocab_size:
            raise RequestError(
                "logit_bias", f"holds token id {params.logit_bias[-1][0]} outside the vocabulary"
            )
        return adapter

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
        if self._dead:
            raise EngineDeadError(self.error or "engine is not running")
        size = self.embedding_size
        if size is None:
            raise RequestError("model", f"{self.model_name} does not serve embeddings (model.task)")
        if not prompt_ids:
            raise RequestError("input", "must contain at least one token")
        if len(prompt_ids) > self.max_model_len:
            raise RequestError(
                "input", f"{len(prompt_ids)} tokens exceed the model's limit of {self.max_model_len}"
            )
        if dimensions is not None and not 1 <= dimensions <= size:
            raise RequestError("dimensions", f"must be in [1, {size}], got {dimensions}")
        self._check_room(1)
        embed = EmbedParams(dimensions, self._embed_every_token, self._embed_whole)
        seq = Seq(next(self._seq_ids), request_id, list(prompt_ids), _EMBED_SAMPLING, deadline=deadline)
        seq.embed = embed
        self._inbox.put([[seq]])

    # ---- LoRA adapters (any thread) -------------------------------------------------------------
    def _adapter(self, name: str) -> LoraAdapter:
        if self.lora is None:
            raise AdapterError(AdapterErrorKind.NOT_FOUND, name, f"The model '{name}' does not exist")
        return self.lora.get(name)

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
        if self.grammars is None:
            raise GrammarUnavailable(spec.param, self._no_grammar)
        self.grammars.compile(spec)

    def _make_seqs(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, n: int, deadline: float | None
    ) -> list[Seq]:
        seqs: list[Seq] = []
        for i in range(n):
            p = params
            if i and params.seed is not None:
                p = SamplingParams(**{**params.__dict__, "seed": params.seed + i})
            seq = Seq(next(self._seq_ids), request_id, list(prompt_ids), p, index=i, deadline=deadline)
            seq.leader = seqs[0] if seqs else None
            if p.grammar is not None:
                self.prepare_grammar(p.grammar)  # a cache hit after the HTTP layer's prepare
                assert self.grammars is not None
                seq.grammar = self.grammars.matcher(p.grammar)
            seqs.append(seq)
        return seqs

    def stats(self) -> EngineStats:
        blocks = self.core.blocks
        spec = self.core.spec.stats if self.core.spec is not None else None
        return EngineStats(
            running=self.core.num_running,
            waiting=self.core.num_waiting + self._inbox.queued,
            kv_blocks_used=blocks.num_used,
            kv_blocks_total=blocks.num_usable,
            kv_tokens_total=blocks.num_usable * blocks.block_size,
            steps=self.core.steps,
            prompt_tokens=blocks.stats.queried_tokens,
            cached_prompt_tokens=blocks.stats.hit_tokens,
            generated_tokens=self.core.generated_tokens,
            cached_blocks=blocks.num_cached,
            busy_seconds=self._busy,
            ring_wakeups=self.ring.wakeups,
            ring_full_waits=self.ring.full_waits,
            handoff_timeouts=self.ring.release_timeouts,
            handoff_wait_seconds=self.ring.release_wait_s,
            device_wait_seconds=self.core.wait_seconds,
            spec_drafted=spec.drafted if spec else 0,
            spec_accepted=spec.accepted if spec else 0,
            spec_verified=spec.verified if spec else 0,
        )

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
                    self._wake.wait(0.1)
                    self._wake.clear()
                    continue
                t0 = time.perf_counter()
                out = self.core.step(publisher.before_run, publisher.after_launch)
                publisher.flush()  # neither hook was called if nothing was scheduled
                if out is None and not aborted:
                    # work, none of it runnable now (embeddings waiting out chat's share): no spin
                    self._wake.wait(0.001)
                    self._wake.clear()
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
            self.error = f"engine thread died: {type(exc).__name__}: {exc}"
            log.exception("engine thread died")
            self._dead = True
            publisher.salvage()  # tokens already produced go out before the failures
            self._fail_everything()
            raise

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
