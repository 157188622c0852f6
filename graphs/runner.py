"""GraphRunner: the decode step as a graph, per device.

- CUDA: one graph per bucket, captured at start-up (graphs/cuda_capture.py). run() pads a b-row
  batch up to its bucket in the static buffers, lets the model plan on the host, replays, and
  returns the first b output rows.
- CPU: the same forward compiled by torch.compile (graphs/compiled.py), built on a background
  thread while steps run eager; "replay" is a call of the compiled function on the static buffers.
  A step runs at its exact row count (no padding: the dimension is dynamic, padding would only add
  work; `pad_to_buckets` pads anyway, as CUDA does, for tests) and with the block table trimmed
  to the step's longest context.
Batches above the largest bucket run eager and unpadded; so does every batch when graphs are off,
unless `pad_eager` asks for the padded path anyway (CPU tests of the padding).

The tensor run() returns after a replay is the graph's own output buffer: it is overwritten by the
next replay (of any bucket, the pool is shared), so consume it before the next run(). The KV cache
and every tensor the model read while capturing must stay where they are for the graphs' lifetime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from rillet.graphs.aot.saved import AotPlan, Progress
from rillet.graphs.aot.step import ByRows, small_batch_rows
from rillet.graphs.buckets import resolve_buckets, select_bucket, verify_buckets
from rillet.graphs.compile_modes import MIN_WIDTH, compile_decode
from rillet.graphs.compiled import CompiledDecode
from rillet.graphs.cuda_capture import CudaCapture
from rillet.graphs.decode_mode import resolve_decode_mode
from rillet.graphs.interface import DecodeBatch, DecodeModel, GraphSettings, VerifyBatch, VerifyModel
from rillet.graphs.static_buffers import StaticBuffers
from rillet.graphs.verify import CompiledVerify, VerifyBuffers, as_decode_rows


class GraphRunner(CudaCapture):
    def __init__(
        self,
        model: DecodeModel,
        settings: GraphSettings,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device | str,
        pad_eager: bool = False,
        pad_to_buckets: bool | None = None,
        verify_queries: int = 0,
        verify_max_rows: int = 0,
        plan: AotPlan | None = None,
    ) -> None:
        """`pad_to_buckets`: run the compiled CPU step padded to buckets as CUDA graphs are
        (None = only on CUDA, where it is required). `verify_queries`: Q of the speculative verify
        step (0 = none; the model is then also a VerifyModel), run as a graph for batches of up to
        `verify_max_rows` rows (graphs/verify.py). `plan`: the compiled CPU step from saved
        artifacts (graphs/aot/), built and saved when missing."""
        self.model = model
        self.device = torch.device(device)
        self.buckets = resolve_buckets(settings.buckets, max_num_seqs)
        self.mode, self.mode_reason = resolve_decode_mode(settings, self.device)
        self.use_graphs = self.mode == "cuda_graphs"
        # "auto" is resolved by the caller, which knows the model (core/runtime.py:
        # resolve_compile_mode); one that does not gets torch.compile's default
        self.compile_mode = "default" if settings.compile_mode == "auto" else settings.compile_mode
        self.pad_to_buckets = self.use_graphs if pad_to_buckets is None else pad_to_buckets
        self.compiled: CompiledDecode | None = None
        self.verify_queries = verify_queries
        self.verify_buckets: tuple[int, ...] = ()
        self.verify_compiled: CompiledVerify | None = None
        self.verify_static: VerifyBuffers | None = None
        if verify_queries and self.mode != "eager":
            vmodel = cast(VerifyModel, model)
            self.verify_buckets = verify_buckets(self.buckets, verify_max_rows)
            rows = max(self.verify_buckets[-1], 2)
            self.verify_static = VerifyBuffers.allocate(rows, verify_queries, max_blocks_per_seq, self.device)
            if self.mode == "compiled":
                fn = compile_decode(vmodel.forward_verify, self.compile_mode)
                self.verify_compiled = CompiledVerify(
                    vmodel, fn, verify_queries, max_blocks_per_seq, self.device
                )
        if self.mode == "compiled":
            self.compiled = CompiledDecode(
                model,
                self.compile_mode,
                max_blocks_per_seq=max_blocks_per_seq,
                device=self.device,
                check_faster=settings.enabled == "auto",
                with_batch_1=self.buckets[0] == 1,
                verify=self.verify_compiled,
                plan=plan,
                small_batch=small_batch_rows(settings.small_batch),
            )
        self.padded = self.use_graphs or pad_eager
        self.static: StaticBuffers | None = None
        if self.padded or self.compiled is not None:
            rows = max(self.buckets[-1], 2 if self.compiled is not None else 1)  # batch 1 may run as 2
            self.static = StaticBuffers.allocate(rows, max_blocks_per_seq, self.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._verify_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._verify_outputs: dict[int, torch.Tensor] = {}
        self.num_verify_runs = 0  # verify steps through a graph (captured or compiled)
        self.num_verify_as_decode = 0  # of those, run as decode rows (the small-batch step)
        self.num_replays = 0  # CUDA graph replays, and calls of the compiled CPU step
        self.num_padded_eager = 0
        self.num_eager = 0

    def start_compile(self, background: bool = True) -> None:
        """CPU: build the compiled step (on a thread of its own by default); steps run eager until
        `compiled.ready`. A no-op when the mode is not "compiled"."""
        if self.compiled is not None:
            self.compiled.start(background)

    def build_artifacts(
        self, progress: Progress | None = None, names: Sequence[str] | None = None
    ) -> list[str]:
        """`rillet compile`: build and save, here and now, the artifacts that start_compile would
        load (those of `names` only, when given); returns the steps built (those already saved
        are kept)."""
        if self.compiled is None:
            raise RuntimeError(f"no compiled CPU step to build (decode mode: {self.mode})")
        return self.compiled.build_artifacts(progress, names)

    def stop(self) -> None:
        """The engine is closing: no more background compiling (see CompiledDecode.stop)."""
        if self.compiled is not None:
            self.compiled.stop()

    def poll(self) -> None:
        """On the engine thread between steps: see CompiledDecode.poll."""
        if self.compiled is not None:
            self.compiled.poll()

    def takes(self, b: int) -> bool:
        """Whether run() would give a b-row step a graph (or the padded path): otherwise the
        caller may as well run its own eager forward."""
        if b > self.buckets[-1]:
            return False
        if self.compiled is not None:
            return self.compiled.ready or self.padded
        return self.padded

    def run(self, batch: DecodeBatch) -> torch.Tensor:  # [b, ...]
        """One decode step: graph replay (or the compiled step) when a bucket fits, else eager."""
        b = batch.num_rows
        bucket = select_bucket(b, self.buckets)
        if bucket is not None and self.compiled is not None and self.compiled.ready:
            return self._run_compiled(batch, bucket)
        if not self.padded or bucket is None or self.static is None:
            self.num_eager += 1
            self.model.prepare_decode(batch)
            return self.model.forward_decode(batch)
        padded = self.static.fill(batch, bucket)
        self.model.prepare_decode(padded)
        graph = self._graphs.get(bucket)
        if graph is None:
            self.num_padded_eager += 1
            return self.model.forward_decode(padded)[:b]
        graph.replay()
        self.num_replays += 1
        return self._outputs[bucket][:b]

    def _run_compiled(self, batch: DecodeBatch, bucket: int) -> torch.Tensor:
        assert self.compiled is not None and self.static is not None
        b = batch.num_rows
        rows = self.compiled.rows_for(bucket if self.pad_to_buckets else b)
        width = min(max(batch.block_tables.shape[1], MIN_WIDTH), self.static.max_blocks_per_seq)
        inputs = self.static.fill(batch, rows, width)
        self.model.prepare_decode(inputs)
        self.num_replays += 1
        with torch.inference_mode():  # as compiled: under another grad mode a guard would recompile
            return self.compiled(inputs)[:b]

    # ---- speculative verify steps ------------------------------------------------------------
    def takes_verify(self, b: int) -> bool:
        """Whether run_verify() would give a b-row verify step a graph."""
        if self.verify_static is None or b > self.verify_static.max_rows:
            return False
        if self.compiled is not None:
            cv = self.verify_compiled
            return self.compiled.ready and cv is not None and cv.ready
        bucket = select_bucket(b, self.verify_buckets) if b <= self.verify_buckets[-1] else None
        return bucket is not None and bucket in self._verify_graphs

    def takes_short_prefill(self, longest: int) -> bool:
        """Whether a step with prefill rows, the longest feeding `longest` tokens, may run through
        the multi-query graph (the compiled CPU step only: a captured graph's Q is fixed, and
        padding a prompt's rows to it would cost more than the eager prefill saves)."""
        return self.verify_compiled is not None and 2 <= longest <= self.verify_queries

    def verify_queries_for(self, longest: int) -> int:
        """Q of a verify step through the graph whose longest row holds `longest` tokens: the
        compiled step's Q is dynamic; a captured CUDA graph has the one Q it was captured with."""
        if self.verify_compiled is not None:
            return CompiledVerify.queries_for(longest)
        return self.verify_queries

    def run_verify(self, batch: VerifyBatch) -> torch.Tensor:  # [b * Q, ...]
        """One verify step through its graph (call only when takes_verify says so)."""
        assert self.verify_static is not None
        b, q = batch.num_rows, batch.num_queries
        vmodel = cast(VerifyModel, self.model)
        self.num_verify_runs += 1
        if b * q <= self._small_decode_rows():  # as decode rows, through the small-batch step
            self.num_verify_as_decode += 1
            return self._run_compiled(as_decode_rows(batch), b * q)
        if self.verify_compiled is not None:
            rows = self.verify_compiled.rows_for(b)
            width = min(max(batch.block_tables.shape[1], MIN_WIDTH), self.verify_static.max_blocks_per_seq)
            inputs = self.verify_static.fill(batch, rows, width)
            vmodel.prepare_verify(inputs)
            with torch.inference_mode():
                return self.verify_compiled(inputs)[: b * q]
        bucket = select_bucket(b, self.verify_buckets)
        assert bucket is not None
        vmodel.prepare_verify(self.verify_static.fill(batch, bucket))
        self._verify_graphs[bucket].replay()
        return self._verify_outputs[bucket][: b * q]

    def _small_decode_rows(self) -> int:
        """Query rows up to which a verify step runs as decode rows through the saved small-batch
        step (0: none is in use). Its int4 GEMMs cost per block of 4 rows where the verify step's
        autotuned ones are flat in the rows: on the default model 6.0 / 7.4 / 8.2 ms for 2 / 3 /
        4 rows against ~10 for the verify step (bench/RESULTS.md 2026-12-03)."""
        compiled = self.compiled
        if compiled is None or not compiled.ready or not isinstance(compiled.fn, ByRows):
            return 0
        return min(compiled.fn.rows, self.buckets[-1])
