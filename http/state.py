"""What one running server holds: config, phase, the engine once loaded, its dispatcher, metrics.

Phases: starting (listening, model still loading: 503) -> ready -> draining (503 for new work,
in-flight requests finish) ; dead when the engine thread died. The engine arrives through
`attach`, after the socket is already open, so that clients and load balancers get a clear 503
instead of connection refused while a model loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Literal

from prometheus_client.core import Metric
from rillet.core.config import RilletConfig
from rillet.core.structured.json_style import json_options
from rillet.http.engine_api import EngineLike, vocab_size
from rillet.http.metrics.model_server import ModelServerSeries, ServerFacts, model_server_families
from rillet.http.metrics.registry import Metrics, Sample, dispatch_samples, engine_samples
from rillet.http.net.auth import ApiKeys
from rillet.http.net.conn_limits import ConnLimits
from rillet.http.net.cors import Cors
from rillet.http.observability.tracing import Tracing, make_tracing
from rillet.http.openai.errors import unavailable
from rillet.http.openai.logprobs import TokenTexts
from rillet.http.openai.protocol import Limits
from rillet.http.responses.store import ResponseStore
from rillet.http.stream.dispatcher import Dispatcher
from rillet.http.ui.routes import PUBLIC_ROUTES

log = logging.getLogger(__name__)

Phase = Literal["starting", "ready", "draining", "dead"]
OPEN_ROUTES = frozenset({"/health"}) | PUBLIC_ROUTES  # served without an API key
_WATCH_INTERVAL_S = 0.25


class ServerState:
    def __init__(self, cfg: RilletConfig) -> None:
        self.cfg = cfg
        self.phase: Phase = "starting"
        self.started = int(time.time())
        self.keys = ApiKeys(cfg.server.api_keys, OPEN_ROUTES)
        self.cors = Cors(cfg.server.cors_allowed_origins)
        self.metrics = Metrics(self._samples)
        self._facts: ServerFacts | None = None  # the Model Server Protocol's fixed labels, once attached
        self.metrics.registry.register(ModelServerSeries(self._model_server_families))
        self.connections = ConnLimits(cfg.server, self.metrics.registry)
        self.engine: EngineLike | None = None
        self.dispatcher: Dispatcher | None = None
        self.limits: Limits | None = None
        self.texts: TokenTexts | None = None
        self.responses = ResponseStore(cfg.responses.store_size, cfg.responses.store_ttl_s)
        # request spans (observability.otlp_endpoint); None = off. ConfigError: the extra is missing.
        self.tracing: Tracing | None = make_tracing(cfg.observability)
        self.inflight = 0  # API requests being handled (parsing included); draining waits for 0
        self.idle = asyncio.Event()  # set whenever inflight == 0
        self.idle.set()
        self.died = asyncio.Event()  # set once the engine thread is found dead
        self._tasks: list[asyncio.Task[None]] = []

    # ---- lifecycle ----------------------------------------------------------------------------
    def attach(self, engine: EngineLike) -> None:
        """On the event loop: become the engine's ring consumer and start serving."""
        cfg = self.cfg
        self.engine = engine
        self.texts = TokenTexts(engine.tokenizer)
        self.limits = Limits(
            model_name=engine.model_name,
            max_model_len=engine.max_model_len,
            max_tokens_cap=cfg.server.max_tokens_cap,
            # a request naming no max_tokens gets no more than one naming the cap may ask for
            default_max_tokens=min(cfg.server.default_max_tokens, cfg.server.max_tokens_cap),
            max_n=cfg.server.max_n,
            vocab_size=vocab_size(engine.tokenizer),
            max_prompts=cfg.scheduler.max_waiting,
            json_options=json_options(cfg.structured.whitespace),
            max_tool_calls=cfg.structured.max_tool_calls,
            grammar_repetition_penalty=cfg.structured.repetition_penalty,
            adapters=getattr(engine, "lora", None) or frozenset(),  # the live registry (core/lora/)
            priorities=cfg.scheduler.policy == "priority",
        )
        disp = Dispatcher(
            engine.ring,
            engine.abort,
            cfg.stream.max_buffered_tokens,
            self.metrics,
            getattr(engine, "gate", None),  # engines without one (test doubles): never give way
            write_last=cfg.stream.write_order == "after_release",
        )
        disp.attach(asyncio.get_running_loop())
        ecfg = engine.cfg  # the pool's own config (the server's differs only in tests)
        self._facts = ServerFacts(
            model_name=engine.model_name,
            block_size=ecfg.cache.block_size,
            cache_dtype=ecfg.cache.dtype,
            prefix_caching=ecfg.cache.prefix_caching,
            max_lora=ecfg.lora.max_loras if getattr(engine, "lora", None) is not None else 0,
        )
        self.dispatcher = disp
        self._tasks = [asyncio.create_task(self._watch(disp, engine), name="rillet-engine-watch")]
        self.phase = "ready"

    async def detach(self) -> None:
        """Stop consuming the ring (the engine itself is shut down by its owner)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.dispatcher is not None:
            self.dispatcher.detach()

    async def stop_tracing(self) -> None:
        """Once no handler is left: the spans still queued go out (off the loop: it blocks until
        they are sent, or the exporter's timeout)."""
        tracing = self.tracing
        if tracing is not None:
            self.tracing = None
            await asyncio.to_thread(tracing.shutdown)

    async def _watch(self, disp: Dispatcher, engine: EngineLike) -> None:
        await disp.watch(lambda: engine.healthy, lambda: engine.error, _WATCH_INTERVAL_S)
        log.error("engine died: %s; serving 503 from now on", engine.error)
        self.phase = "dead"
        self.died.set()

    def ready_engine(self) -> EngineLike:
        """The engine, or a 503 naming the phase."""
        engine = self.engine
        if self.phase != "ready" or engine is None:
            raise unavailable(self.phase, (engine.error or "") if engine is not None else "")
        return engine

    # ---- in-flight accounting (for draining) -------------------------------------------------------
    def begin(self) -> None:
        self.inflight += 1
        self.idle.clear()

    def end(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()

    def _samples(self) -> list[Sample]:
        engine, disp = self.engine, self.dispatcher
        if engine is None or disp is None:
            return []
        samples = engine_samples(engine.stats(), engine.ring.wakeups, disp.active)
        gate = getattr(engine, "gate", None)  # engines without one (test doubles): none
        parks, parked_s = (gate.parks, gate.parked_s) if gate is not None else (0, 0.0)
        return samples + dispatch_samples(disp.tokens_routed, disp.cpu_seconds, parks, parked_s)

    def _model_server_families(self) -> list[Metric]:
        engine, facts = self.engine, self._facts
        if engine is None or facts is None:
            return []
        return model_server_families(engine.stats(), facts, time.time())
