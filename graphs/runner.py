"""GraphRunner: decode steps replayed from CUDA graphs captured per batch-size bucket.

capture() (CUDA only) compiles the model's decode forward with torch.compile (fullgraph, the batch
dimension dynamic: one compile serves every bucket above 1, bucket 1 gets its own) and captures it
once per bucket, largest first, all graphs in one memory pool: a smaller graph then reuses the
blocks the larger one freed. run() pads a b-row batch up to its bucket in the static buffers, lets
the model plan on the host, replays, and returns the first b output rows. Batches above the
largest bucket run eager and unpadded; so does every batch when graphs are off, unless `pad_eager`
asks for the padded path anyway (CPU tests of the padding).

The tensor run() returns after a replay is the graph's own output buffer: it is overwritten by the
next replay (of any bucket, the pool is shared), so consume it before the next run(). The KV cache
and every tensor the model read while capturing must stay where they are for the graphs' lifetime.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .buckets import resolve_buckets, select_bucket
from .interface import DecodeBatch, DecodeModel, GraphSettings
from .static_buffers import StaticBuffers

logger = logging.getLogger(__name__)

WARMUP_RUNS = 2  # the first call of a new shape compiles; the second runs what will be captured


def graphs_enabled(setting: str, device: torch.device) -> bool:
    """graphs.enabled resolved for a device: "auto" = CUDA only; "on" off-CUDA is a ValueError."""
    if setting == "off":
        return False
    if setting == "auto":
        return device.type == "cuda"
    if setting == "on":
        if device.type != "cuda":
            raise ValueError(
                f"config key 'graphs.enabled': 'on' needs a CUDA device, the model runs on {device.type}; "
                "use 'auto' (graphs on CUDA only) or 'off'"
            )
        return True
    raise ValueError(f"config key 'graphs.enabled': expected 'auto', 'on' or 'off', got {setting!r}")


class GraphRunner:
    def __init__(
        self,
        model: DecodeModel,
        settings: GraphSettings,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device | str,
        pad_eager: bool = False,
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.buckets = resolve_buckets(settings.buckets, max_num_seqs)
        self.use_graphs = graphs_enabled(settings.enabled, self.device)
        self.compile_mode = settings.compile_mode
        self.padded = self.use_graphs or pad_eager
        self.static: StaticBuffers | None = None
        if self.padded:
            self.static = StaticBuffers.allocate(self.buckets[-1], max_blocks_per_seq, self.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.num_replays = 0
        self.num_padded_eager = 0
        self.num_eager = 0

    @property
    def captured_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def run(self, batch: DecodeBatch) -> torch.Tensor:  # [b, ...]
        """One decode step: graph replay when a bucket fits and is captured, else eager."""
        b = batch.num_rows
        bucket = select_bucket(b, self.buckets) if self.padded else None
        if bucket is None or self.static is None:
            if b < 1:
                raise ValueError(f"decode batch must have >= 1 rows, got {b}")
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
        mark_batch_dynamic(batch)
        for _ in range(WARMUP_RUNS):
            fn(batch)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn(batch)
        return graph, out

    def _compiled_forward(self) -> Callable[[DecodeBatch], torch.Tensor]:
        return compile_decode(self.model.forward_decode, self.compile_mode)


def compile_decode(
    fn: Callable[[DecodeBatch], torch.Tensor], mode: str
) -> Callable[[DecodeBatch], torch.Tensor]:
    """torch.compile with no graph breaks allowed; mode "none" = fn itself."""
    if mode == "none":
        return fn
    if mode == "reduce-overhead":
        # that mode captures CUDA graphs of its own, inside ours: compile plainly instead
        logger.info(
            "graphs.compile_mode 'reduce-overhead': GraphRunner captures the graphs, compiling with 'default'"
        )
        mode = "default"
    return torch.compile(fn, fullgraph=True, mode=mode)


def mark_batch_dynamic(batch: DecodeBatch) -> None:
    """Compile the row dimension as a symbol, so buckets share one compiled graph (a compile per
    bucket would cost minutes for a 7B model). Size 1 is always specialised by dynamo; "maybe"
    lets any code that needs a static row count specialise (and recompile) instead of failing."""
    if batch.num_rows < 2:
        return
    for t in (batch.input_ids, batch.positions, batch.slot_mapping, batch.seq_lens, batch.block_tables):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    torch._dynamo.maybe_mark_dynamic(batch.query_start, 0)


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
