"""CUDA graph capture of the decode (and verify) steps (CudaCapture, a part of GraphRunner:
graphs/runner.py).

The model's decode forward is compiled with torch.compile (fullgraph, the batch dimension
dynamic: one compile serves every bucket above 1, bucket 1 gets its own) and captured once per
bucket, largest first, all graphs in one memory pool: a smaller graph then reuses the blocks the
larger one freed.

Apart from the runner's per-step dispatch: capture runs once, at start-up, on CUDA only; a step
only replays what it left in `_graphs` and `_verify_graphs`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import torch
from rillet.graphs.compile_modes import compile_decode, mark_batch_dynamic
from rillet.graphs.interface import DecodeBatch, DecodeModel, VerifyBatch, VerifyModel
from rillet.graphs.static_buffers import StaticBuffers
from rillet.graphs.verify import VerifyBuffers, mark_verify_dynamic

logger = logging.getLogger(__name__)

B = TypeVar("B", DecodeBatch, VerifyBatch)  # the batch a captured step takes

WARMUP_RUNS = 2  # the first call of a new shape compiles; the second runs what will be captured


class CudaCapture:
    """GraphRunner's capture of its CUDA graphs; see the module docstring."""

    # GraphRunner's state that capture reads and writes (set in its __init__)
    model: DecodeModel
    device: torch.device
    buckets: tuple[int, ...]
    use_graphs: bool
    compile_mode: str
    static: StaticBuffers | None
    verify_queries: int
    verify_buckets: tuple[int, ...]
    verify_static: VerifyBuffers | None
    _graphs: dict[int, torch.cuda.CUDAGraph]
    _outputs: dict[int, torch.Tensor]
    _verify_graphs: dict[int, torch.cuda.CUDAGraph]
    _verify_outputs: dict[int, torch.Tensor]

    @property
    def captured_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def _capture_verify(self, fn: Callable[[VerifyBatch], torch.Tensor], rows: int, pool: Any) -> None:
        assert self.verify_static is not None
        batch = self.verify_static.padding(rows)
        vmodel = cast(VerifyModel, self.model)
        vmodel.prepare_verify(batch)
        if rows > 1:
            mark_verify_dynamic(batch, strict=False)
        self._verify_graphs[rows], self._verify_outputs[rows] = self._record(fn, batch, pool)

    def capture(self) -> None:
        """Compile and capture one graph per bucket, largest first, into one memory pool."""
        if not self.use_graphs or self.static is None:
            raise RuntimeError(f"capture() needs graphs enabled on a CUDA device (device: {self.device})")
        fn = self._compiled_forward()
        pool = torch.cuda.graph_pool_handle()
        start = time.perf_counter()
        with torch.inference_mode(), _recompile_limit(4 * len(self.buckets) + 8):
            for n in reversed(self.buckets):
                self._graphs[n], self._outputs[n] = self._capture_one(fn, n, pool)
            if self.verify_queries:
                verify = compile_decode(cast(VerifyModel, self.model).forward_verify, self.compile_mode)
                for n in reversed(self.verify_buckets):
                    self._capture_verify(verify, n, pool)
        torch.cuda.synchronize(self.device)
        logger.info(
            "captured %d decode graphs (batch sizes %s) in %.1f s, compile_mode=%s",
            len(self._graphs),
            ",".join(map(str, self.buckets)),
            time.perf_counter() - start,
            self.compile_mode,
        )

    def _capture_one(
        self, fn: Callable[[DecodeBatch], torch.Tensor], rows: int, pool: Any
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        assert self.static is not None
        batch = self.static.padding(rows)
        self.model.prepare_decode(batch)  # host planning happens outside the graph, as at replay
        mark_batch_dynamic(batch)  # maybe: a model that specialises recompiles, capture goes on
        return self._record(fn, batch, pool)

    def _record(
        self, fn: Callable[[B], torch.Tensor], batch: B, pool: Any
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """fn on batch: warm-up runs (they compile and autotune), then one run captured into `pool`."""
        for _ in range(WARMUP_RUNS):
            fn(batch)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn(batch)
        return graph, out

    def _compiled_forward(self) -> Callable[[DecodeBatch], torch.Tensor]:
        return compile_decode(self.model.forward_decode, self.compile_mode)


@contextmanager
def _recompile_limit(limit: int) -> Iterator[None]:
    """Bucket 1, and every bucket if the model specialises its row count after all, is one more
    compile of the same function; past dynamo's default limit (8) it would silently run eager.
    Raised only while capturing: a replay runs no Python, so no guard is checked after it."""
    import torch._dynamo.config as dynamo_config

    names = (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    )
    present = {n: max(limit, getattr(dynamo_config, n)) for n in names if hasattr(dynamo_config, n)}
    with dynamo_config.patch(present):
        yield
