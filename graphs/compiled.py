"""The decode step compiled with torch.compile for CPU, built on a background thread.

One compile serves every batch size from 2 up: the row dimension and the block-table width are
dynamic (symbolic) dimensions, so a step runs at its exact size with no padding and no recompile.
Dynamo always specialises a dimension of size 1, so batch 1 is a second graph; it is compiled
after the general one, and until it is ready a batch of 1 runs padded to 2 rows. (Measured on
the default model: exact batch 1 is ~13 % faster per step than padded to 2; marking the row
dimension unbacked gave wrong rows, and `backed_size_oblivious` still specialised on a stride
guard: see bench/RESULTS.md.) The block table is never narrower than 2 columns, for the same
reason: a width of 1 would be a third compile.

`start()` compiles on a thread of its own while the engine serves eager; `ready` flips once the
general graph works (a bool read by the engine between steps: the switch is atomic per step).
Inductor's on-disk caches (FX graph and AOTAutograd) live under `cache_dir`, so a restart
re-traces with dynamo (seconds) but compiles no C++.

Under `graphs.enabled: auto` the step is used only once it has been timed against eager on the
model's own thread (SpeedCheck: graphs/speed_check.py). With an artifact plan (`plan`), the step
is first looked up as a saved AOTInductor library, or built and saved, and compiled with
torch.compile only when that cannot be (ArtifactSteps: graphs/aot/artifact_steps.py).
"""

from __future__ import annotations

import logging
import threading
import time

import torch
from rillet.graphs.aot.artifact_steps import ArtifactSteps
from rillet.graphs.aot.saved import AotPlan
from rillet.graphs.compile_modes import (
    COMPILE_ROWS,
    COMPILE_WIDTH,
    DecodeFn,
    compile_decode,
    freezes,
    mark_batch_dynamic,
)
from rillet.graphs.compile_thread import (
    COMPILE_SWITCH_INTERVAL_S,
    cache_hits,
    gil_switch_interval,
    lower_this_threads_priority,
    summary,
)
from rillet.graphs.frozen import frozen_weights
from rillet.graphs.interface import DecodeBatch, DecodeModel
from rillet.graphs.speed_check import SpeedCheck
from rillet.graphs.static_buffers import StaticBuffers
from rillet.graphs.verify import CompiledVerify

logger = logging.getLogger(__name__)


class CompiledDecode(SpeedCheck, ArtifactSteps):
    """The compiled decode function of one model, for CPU; see the module docstring."""

    def __init__(
        self,
        model: DecodeModel,
        compile_mode: str,
        *,
        max_blocks_per_seq: int,
        device: torch.device,
        check_faster: bool,
        with_batch_1: bool,
        verify: CompiledVerify | None = None,
        plan: AotPlan | None = None,
        small_batch: int = 0,
    ) -> None:
        self.model = model
        self.plan = plan  # saved artifacts (graphs/aot/): loaded, or built and saved, before compiling
        self.small_batch = small_batch  # saved steps: rows up to which the small-batch step runs
        self.verify = verify  # speculative decoding: compiled after the decode graphs
        self.device = device
        self.compile_mode = compile_mode
        self.check_faster = check_faster  # graphs.enabled auto: keep it only when measured faster
        self.with_batch_1 = with_batch_1
        self.fn: DecodeFn = compile_decode(model.forward_decode, compile_mode)
        # the compiles' own inputs: never the buffers the engine fills while it serves eager
        self._warm = StaticBuffers.allocate(COMPILE_ROWS, max(max_blocks_per_seq, COMPILE_WIDTH), device)
        self.ready = False  # the general graph (rows >= 2) is compiled and chosen
        self.ready_1 = False  # the batch-1 graph too
        self.settled = False  # no compile will follow: guards may be skipped (see __call__)
        self.failed: str | None = None  # why compiled decode is off (error, or not faster)
        self.freeze = freezes(compile_mode, device)
        self._weights_key: str | None = None  # set on the compile thread when freezing (frozen.py)
        self.seconds: dict[str, float] = {}
        # auto: every graph is built, the check against eager waits for poll() on the model's thread
        self._check_due = False
        self._check_batch: DecodeBatch | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._stopping = threading.Event()

    def start(self, background: bool = True) -> None:
        if background:
            # not a daemon, said explicitly (a thread inherits its starter's flag, and the engine
            # thread that starts this one is a daemon): interpreter exit must wait for a compile
            # in flight, since one cut off inside Inductor aborts the process at exit ("terminate
            # called without an active exception", exit status 134). stop() shortens that wait.
            self._thread = threading.Thread(target=self._run, name="rillet-compile", daemon=False)
            self._thread.start()
        else:
            self._run()

    def stop(self) -> None:
        """The engine is closing: compile nothing more. A compile in flight cannot be interrupted;
        the thread ends after it (at most one graph's compile, ~50 s cold on 2 cores)."""
        self._stopping.set()
        if self.plan is not None and self.plan.builder is not None:
            self.plan.builder.cancel()  # a child process: ended at once, nothing half-saved
        if self._thread is not None and self._thread.is_alive():
            logger.info("closing: the decode step's compile in flight finishes first (not interruptible)")
        elif self._check_due:
            self._check_due = False
            self.failed = "the engine closed before the compiled step was timed"
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once compiling has finished (ready, or given up): under auto, once poll() has
        timed the compiled step too."""
        return self._done.wait(timeout)

    def __call__(self, batch: DecodeBatch) -> torch.Tensor:
        """One step. Once every graph is built, dynamo checks only the guards that tell its two
        graphs apart (rows == 1 or not), not the ~10 per weight it checks otherwise (~0.7 ms a
        step on the default model): the inputs are always views of the same static buffers, under
        inference mode, with widths >= 2, so the skipped guards hold by construction."""
        if self.settled:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self.fn(batch)
        return self.fn(batch)

    def rows_for(self, b: int) -> int:
        """Rows to run b real rows at: b itself, or 2 while the batch-1 graph is not compiled."""
        return 2 if b == 1 and not self.ready_1 else b

    def _run(self) -> None:
        on_own_thread = threading.current_thread() is self._thread
        if on_own_thread:
            lower_this_threads_priority()
        interval = COMPILE_SWITCH_INTERVAL_S if on_own_thread else None
        try:
            with torch.inference_mode(), gil_switch_interval(interval):
                self._compile_all()
        except Exception as exc:  # a compile error must not take the server down: stay eager
            self._check_due = False
            self.failed = summary(exc)
            if self._stopping.is_set():  # the engine closed under it (its runtime is going away)
                logger.debug("compile ended with the engine: %s", self.failed)
            else:
                logger.warning("compiled decode off, serving eager: compile failed (%s)", self.failed)
        if self._check_due and not on_own_thread:  # compiled synchronously: this is the model's thread
            self._check_due = False
            self._decide()
        elif not self._check_due:
            self._done.set()

    def _compile_all(self) -> None:
        total = time.perf_counter()
        if self.plan is not None and self._from_artifacts(self.plan):
            self._finish(self._warm.padding(COMPILE_ROWS, COMPILE_WIDTH), total)
            return
        mode = self.compile_mode + (", weights frozen" if self.freeze else "")
        logger.info("compiling the decode step (torch.compile, mode %s) in the background", mode)
        if self.freeze:
            self._weights_key = self.model.weights_key()
        batch = self._warm.padding(COMPILE_ROWS, COMPILE_WIDTH)
        mark_batch_dynamic(batch, width=True, strict=True)
        if self._stopping.is_set():
            return
        self._timed("batch 2+", batch)
        if self._stopping.is_set():
            return
        if not self.check_faster:
            self.ready = True
            logger.info("decode step: compiled graph in use (batch 1 runs as 2 rows until its own graph)")
        if self.with_batch_1 and not self._stopping.is_set():
            one = self._warm.padding(1, COMPILE_WIDTH)
            mark_batch_dynamic(one, width=True, strict=True)
            self._timed("batch 1", one)
            self.ready_1 = not self.check_faster
        if self.verify is not None and not self._stopping.is_set():
            self._compile_verify(self.verify)
        self._finish(batch, total)

    def _finish(self, batch: DecodeBatch, total: float) -> None:
        logger.info(
            "decode step compiled in %.1f s (%s)",
            time.perf_counter() - total,
            ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()),
        )
        if self.check_faster and not self._stopping.is_set():
            self._check_batch = batch
            self._check_due = True  # see poll()
            logger.info("decode step: timing the compiled step against eager on the engine thread")
        else:
            self.settled = True

    def _compile_verify(self, verify: CompiledVerify) -> None:
        """A failed verify compile leaves verify steps eager; the decode graphs stay in use."""
        try:
            with frozen_weights(self._weights_key):
                verify.compile(self._stopping.is_set)
            self.seconds["verify"] = verify.seconds
        except Exception as exc:
            verify.failed = summary(exc)
            logger.warning("compiled verify step off, verifying eager: compile failed (%s)", verify.failed)

    def _timed(self, name: str, batch: DecodeBatch) -> None:
        hits = cache_hits()
        start = time.perf_counter()
        self.model.prepare_decode(batch)
        with frozen_weights(self._weights_key):
            self.fn(batch)
        self.seconds[name] = time.perf_counter() - start
        cached = "Inductor cache hit" if cache_hits() > hits else "compiled"
        logger.info("decode graph for %s: %.1f s (%s)", name, self.seconds[name], cached)
