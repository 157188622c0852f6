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

Under `graphs.enabled: auto` the compiled step is kept only if it measures no slower than eager,
and that measurement runs on the model's own thread (`poll()`, called by the engine between
steps) once the compile thread has ended, never on the compile thread: torch's OpenMP pool
belongs to the thread that built the model, and a forward on any other thread ran 2.3x slower
(measured: 19-21 ms vs 8.2 ms at batch 2, eager), enough to time the tuned step below as slower
than eager (25.5 vs 22.9 ms) when on the engine thread it is 1.7x faster.

With an artifact plan (`plan`: graphs/aot/), the step is first looked up as a saved AOTInductor
library under the model's key, and built and saved when there is none (in a niced child process
when the plan has a builder): a restart then loads it in a second or two and compiles nothing.
Its row dimension starts at 1 (export keeps that symbol), so the one library serves batch 1 as
well, and the KV pool's block count is an input dimension: another pool size reuses it. When no
plan is given, or the model cannot be saved, or the artifact path fails, the step is compiled
with torch.compile as described above.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

import torch
from rillet.graphs.aot.saved import AotPlan, Progress, SavedSteps
from rillet.graphs.aot.step import SavedDecode
from rillet.graphs.compile_modes import compile_decode, freezes, mark_batch_dynamic
from rillet.graphs.compile_thread import (
    COMPILE_SWITCH_INTERVAL_S,
    cache_hits,
    gil_switch_interval,
    lower_this_threads_priority,
    summary,
)
from rillet.graphs.frozen import frozen_weights
from rillet.graphs.interface import DecodeBatch, DecodeModel, SavableModel
from rillet.graphs.static_buffers import StaticBuffers
from rillet.graphs.verify import CompiledVerify

logger = logging.getLogger(__name__)

MIN_WIDTH = 2  # block-table columns; 1 would be specialised (a compile of its own)
COMPILE_ROWS, COMPILE_WIDTH = 2, 3  # example sizes: distinct, so dynamo keeps two symbols
CHECK_RUNS = 7  # timed calls of each path for `graphs.enabled: auto`, interleaved
# auto keeps the compiled step unless it measures this much slower than eager: the check runs
# between two engine steps of a live server (the host's other threads busy), which can slow
# either path by 30 % for a moment; compiled measured 1.2-1.7x faster on every CPU model tried
SLOWER_THAN_EAGER = 1.10

DecodeFn = Callable[[DecodeBatch], torch.Tensor]


class CompiledDecode:
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

    def poll(self) -> None:
        """On the model's own thread, between steps (the engine calls it, idle or not): under
        `graphs.enabled: auto`, once the compile thread has ended, time the compiled step against
        eager here and switch to it if it is no slower. Otherwise nothing (an attribute read)."""
        if not self._check_due or (self._thread is not None and self._thread.is_alive()):
            return
        self._check_due = False
        self._decide()

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

    def _from_artifacts(self, plan: AotPlan) -> bool:
        """The steps from saved artifacts (built first if missing); False: compile them instead."""
        verify = self.verify
        try:
            steps = self._saved_steps(plan)
            if steps is None:
                logger.info("decode step: this model's compiled step cannot be saved (torch.compile)")
                return False
            got = steps.obtain(self._example(), verify.example() if verify else None, self._stopping)
        except Exception as exc:  # a failed build or load: torch.compile, as without artifacts
            logger.warning("compiled artifacts unusable (%s): compiling with torch.compile", summary(exc))
            return False
        if got is None:
            return True  # the engine is closing: nothing is published
        self.fn, self.seconds = got.decode, got.seconds
        if verify is not None and got.verify is not None:
            verify.use(got.verify)
        if not self.check_faster:
            self.ready_1 = self.with_batch_1  # one library serves every row count
            self.ready = True
            logger.info("decode step: compiled graph in use (saved artifact)")
        self._add_small(steps, got.decode)
        return True

    def _add_small(self, steps: SavedSteps, general: SavedDecode) -> None:
        """The small-batch step beside the general one once it is built (a first start builds it
        last, while the general step already serves); a failure leaves the general step alone."""
        try:
            both = steps.with_small(general, self._example(), self._stopping)
        except Exception as exc:
            logger.warning(
                "small-batch decode step off (%s): every batch takes the general step", summary(exc)
            )
            return
        if both is not None:
            self.fn = both  # one attribute write: the engine thread's next step takes it
            logger.info("decode step: batches of up to %d rows take the small-batch step", both.rows)

    def build_artifacts(
        self, progress: Progress | None = None, names: Sequence[str] | None = None
    ) -> list[str]:
        """The missing saved steps (of `names`, else all), built in this process (see
        GraphRunner.build_artifacts)."""
        steps = self._saved_steps(self.plan) if self.plan is not None else None
        if steps is None:
            raise RuntimeError("nothing is saved for this step (no plan, or a model that cannot be)")
        missing = steps.missing([n for n in steps.keys if names is None or n in names])
        with torch.inference_mode():
            example = self.verify.example() if self.verify is not None else None
            steps.build(missing, self._example(), example, progress)
        return missing

    def _saved_steps(self, plan: AotPlan) -> SavedSteps | None:
        model = cast(SavableModel, self.model)
        if model.graph_key() is None:
            return None
        return SavedSteps(
            model,
            plan,
            self.compile_mode,
            self.freeze,
            verify=self.verify is not None,
            small_rows=self.small_batch,
        )

    def _example(self) -> DecodeBatch:
        return self._warm.padding(COMPILE_ROWS, COMPILE_WIDTH)

    def _compile_verify(self, verify: CompiledVerify) -> None:
        """A failed verify compile leaves verify steps eager; the decode graphs stay in use."""
        try:
            with frozen_weights(self._weights_key):
                verify.compile(self._stopping.is_set)
            self.seconds["verify"] = verify.seconds
        except Exception as exc:
            verify.failed = summary(exc)
            logger.warning("compiled verify step off, verifying eager: compile failed (%s)", verify.failed)

    def _decide(self) -> None:
        """graphs.enabled auto, on the model's thread: keep the compiled step if it is no slower."""
        assert self._check_batch is not None
        try:
            with torch.inference_mode():
                keep = self._faster(self._check_batch)
        except Exception as exc:  # the compiled step failed to run: stay eager
            self.failed = summary(exc)
            logger.warning("compiled decode off, serving eager: the compiled step failed (%s)", self.failed)
            keep = False
        if keep:
            self.ready_1 = self.with_batch_1  # before `ready`: the engine reads them in that order
            self.ready = True
            self.settled = True
        self._done.set()

    def _timed(self, name: str, batch: DecodeBatch) -> None:
        hits = cache_hits()
        start = time.perf_counter()
        self.model.prepare_decode(batch)
        with frozen_weights(self._weights_key):
            self.fn(batch)
        self.seconds[name] = time.perf_counter() - start
        cached = "Inductor cache hit" if cache_hits() > hits else "compiled"
        logger.info("decode graph for %s: %.1f s (%s)", name, self.seconds[name], cached)

    def _faster(self, batch: DecodeBatch) -> bool:
        """graphs.enabled auto: time both paths on the same small batch, interleaved; keep the
        compiled step unless its median is clearly slower (SLOWER_THAN_EAGER)."""
        eager: list[float] = []
        compiled: list[float] = []
        for _ in range(CHECK_RUNS):
            for fn, times in ((self.model.forward_decode, eager), (self.fn, compiled)):
                self.model.prepare_decode(batch)
                t0 = time.perf_counter()
                fn(batch)
                times.append(time.perf_counter() - t0)
        e, c = statistics.median(eager) * 1e3, statistics.median(compiled) * 1e3
        if c <= e * SLOWER_THAN_EAGER:
            logger.info("decode step: compiled %.2f vs eager %.2f ms a step (batch 2): compiled in use", c, e)
            return True
        self.failed = f"compiled {c:.2f} ms vs eager {e:.2f} ms per step (batch 2): slower"
        logger.info("decode step stays eager: %s", self.failed)
        return False
