"""The GPU check's speculative-decoding part: what a verify step costs against a plain decode step.

Random weights accept no draft, so only the cost side is measured: on the 7B engine the check
built (flashinfer attention, CUDA graphs), the bare forward of a verify step with k = 1, 2, 4, 8
draft tokens per row (Q = 1 + k queries, graphs/interface.py VerifyBatch, planned by the
backend's begin_verify) beside a decode step's, both captured into CUDA graphs here (eager, not
compiled: the same conditions for both) at batch 1 and 16 over a random context. The ratio
verify / decode is the price of one step that may yield up to 1 + k tokens. On the CPU (a smoke
run) the same forwards are timed eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from rillet.core.llm import LLM
from rillet.graphs.interface import DecodeBatch, VerifyBatch

from bench.gpu.timing import elapsed_ms, sync

KS = (1, 2, 4, 8)
ROWS = (1, 16)


def _tables(rows: int, context: int, block_size: int, num_blocks: int, device: torch.device) -> torch.Tensor:
    per = -(-(context + max(KS) + 1) // block_size)
    first = num_blocks - rows * per
    if first < 1:
        raise ValueError(f"{rows} x {context} tokens do not fit the pool ({num_blocks} blocks)")
    t = torch.arange(first, first + rows * per, dtype=torch.int32).view(rows, per)
    return t.to(device)


def _slots(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    rows = torch.arange(tables.shape[0], device=tables.device)[:, None].expand_as(positions)
    return tables[rows, positions // block_size].long() * block_size + positions % block_size


def decode_batch(tables: torch.Tensor, context: int, block_size: int, vocab: int) -> DecodeBatch:
    rows, device = tables.shape[0], tables.device
    pos = torch.full((rows, 1), context - 1, dtype=torch.long, device=device)
    return DecodeBatch(
        input_ids=torch.randint(3, vocab, (rows,), device=device),
        positions=pos[:, 0],
        slot_mapping=_slots(tables, pos, block_size)[:, 0],
        seq_lens=torch.full((rows,), context, dtype=torch.int32, device=device),
        block_tables=tables,
        query_start=torch.arange(rows + 1, dtype=torch.int32, device=device),
        seq_lens_cpu=[context] * rows,
    )


def verify_batch(tables: torch.Tensor, context: int, k: int, block_size: int, vocab: int) -> VerifyBatch:
    rows, device, q = tables.shape[0], tables.device, 1 + k
    pos = (context - 1 + torch.arange(q, device=device))[None].expand(rows, q).contiguous()
    return VerifyBatch(
        input_ids=torch.randint(3, vocab, (rows, q), device=device),
        positions=pos,
        slot_mapping=_slots(tables, pos, block_size),
        seq_lens=torch.full((rows,), context + k, dtype=torch.int32, device=device),
        query_lens=torch.full((rows,), q, dtype=torch.int32, device=device),
        block_tables=tables,
        seq_lens_cpu=[context + k] * rows,
        query_lens_cpu=[q] * rows,
    )


def _timed(
    prepare: Callable[[], None], forward: Callable[[], torch.Tensor], device: torch.device, iters: int
) -> float:
    """ms of one forward: replayed from a CUDA graph on a GPU (planned once, as a replay is),
    called eager elsewhere."""
    prepare()
    for _ in range(2):
        forward()
    sync(device)
    if device.type != "cuda":
        return elapsed_ms(forward, device, reps=iters)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forward()
    graph.replay()
    ms = elapsed_ms(graph.replay, device, reps=iters)
    del graph
    return ms


@torch.inference_mode()
def verify_cost(llm: LLM, context: int, iters: int) -> dict[str, Any]:
    runner: Any = llm.engine.runtime.runner
    gr = runner.graph_runner
    adapter: Any = gr.model if gr is not None else None
    if adapter is None:  # graphs off: the runner's model through an adapter of its own
        from rillet.core.runner.graph_adapter import DecoderGraphAdapter

        adapter = DecoderGraphAdapter(runner.model, runner.kv_caches, runner.block_size)
    device, bs = runner.device, runner.block_size
    num_blocks = runner.kv_caches[0][0].shape[0]
    vocab = runner.model.arch.vocab_size
    for kc, vc, _ in runner.kv_caches:  # random context, not zeros (a float pool: no scales)
        kc.normal_()
        vc.normal_()
    results: list[dict[str, Any]] = []
    for rows in ROWS:
        tables = _tables(rows, context, bs, num_blocks, device)
        d = decode_batch(tables, context, bs, vocab)
        decode_ms = _timed(
            lambda d=d: adapter.prepare_decode(d), lambda d=d: adapter.forward_decode(d), device, iters
        )
        for k in KS:
            v = verify_batch(tables, context, k, bs, vocab)
            ms = _timed(
                lambda v=v: adapter.prepare_verify(v), lambda v=v: adapter.forward_verify(v), device, iters
            )
            results.append(
                {"rows": rows, "k": k, "decode_ms": decode_ms, "verify_ms": ms, "ratio": ms / decode_ms}
            )
    return {"context": context, "iters": iters, "steps": results}
