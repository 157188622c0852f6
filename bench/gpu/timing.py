"""Timings for bench/gpu/check.py: device copy bandwidth (the roofline's denominator), one decode
step of the model runner and one bare graph replay on a fixed batch, and decode through the
threaded engine end to end. CUDA events on a GPU, the host clock on the CPU (smoke test).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.llm import LLM
from rillet.core.model.decoder import DecoderModel
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.graphs.buckets import select_bucket


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def elapsed_ms(fn: Callable[[], object], device: torch.device, reps: int = 1) -> float:
    """Mean ms of `reps` back-to-back calls: CUDA events on a GPU, the host clock elsewhere."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


def random_ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    # ids >= 3 keep clear of BOS/EOS-like specials; random text, never zeros
    return [int(t) for t in torch.randint(3, vocab, (n,), generator=gen)]


def copy_bandwidth(device: torch.device, nbytes: int, iters: int = 10) -> dict[str, Any]:
    """Device-to-device copy of `nbytes`; bandwidth counts bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = [elapsed_ms(lambda: dst.copy_(src), device) for _ in range(iters)]
    ms = statistics.median(times)
    moved = 2 * src.numel() * src.element_size()
    return {"bytes_per_copy": src.numel() * 2, "median_ms": ms, "times_ms": times, "tb_s": moved / ms / 1e9}


def decode_batch(n: int, context: int, block_size: int, num_blocks: int, vocab: int) -> ScheduledBatch:
    """n decode rows at `context` tokens each, over blocks at the top of the pool (the block
    manager hands out low ids first; whatever it cached there is only overwritten, never used)."""
    per = -(-context // block_size)
    first = num_blocks - n * per
    if first < 1:
        raise ValueError(f"{n} x {context} tokens need {n * per} blocks, the pool has {num_blocks - 1}")
    gen = torch.Generator().manual_seed(n * 7919 + context)
    seqs = []
    for i in range(n):
        s = Seq(10**9 + i, f"bench-{i}", random_ids(context, vocab, gen), SamplingParams(temperature=0.0))
        s.block_table = list(range(first + i * per, first + (i + 1) * per))
        s.num_computed = context - 1  # the last prompt token is this step's input
        seqs.append(s)
    return ScheduledBatch(seqs, [1] * n)


def decode_bytes(model: DecoderModel, rows: int, context: int) -> int:
    """Bytes one decode step must read: every weight but an untied embedding table (rows of it only),
    plus each row's K and V over its context."""
    w = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head is not None:
        w -= model.embed_tokens.numel() * model.embed_tokens.element_size()
    a = model.arch
    kv = rows * context * a.num_layers * 2 * a.num_kv_heads * a.head_dim * model.embed_tokens.element_size()
    return w + kv


@torch.inference_mode()
def step_timing(llm: LLM, rows: int, context: int, iters: int, warmup: int) -> dict[str, Any]:
    """ModelRunner.step on a fixed decode batch (host prep, replay, logits, greedy sample, sync),
    and the bare graph replay of its bucket (GPU time of the forward alone, CUDA events)."""
    runner: Any = llm.engine.runtime.runner
    cfg = llm.engine.cfg
    model: DecoderModel = runner.model
    device = runner.device
    num_blocks = runner.kv_caches[0][0].shape[0]
    for k, v, _ in runner.kv_caches:  # random context, not zeros (a float pool: no scales)
        k.normal_()
        v.normal_()
    batch = decode_batch(rows, context, cfg.cache.block_size, num_blocks, model.arch.vocab_size)
    for _ in range(warmup):
        runner.step(batch)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        runner.step(batch)  # ends in the sampler's .tolist(): one step, no overlap
    step_ms = (time.perf_counter() - t0) * 1e3 / iters
    replay_ms = None
    gr = runner.graph_runner
    bucket = select_bucket(rows, gr.buckets) if gr is not None else None
    graph = gr._graphs.get(bucket) if gr is not None and bucket is not None else None
    if graph is not None:
        runner.step(batch)  # fills the static buffers and plans this batch
        graph.replay()
        replay_ms = elapsed_ms(graph.replay, device, reps=iters)
    for s in batch.seqs:
        runner.release(s)
    return {
        "rows": rows,
        "context": context,
        "bucket": bucket,
        "step_ms": step_ms,
        "replay_ms": replay_ms,
        "bytes_per_step": decode_bytes(model, rows, context),
    }


def engine_decode_rate(
    llm: LLM, prompts: list[list[int]], new_tokens: int, logit_bias: tuple[tuple[int, float], ...] = ()
) -> dict[str, Any]:
    """End-to-end decode through the threaded engine: time(1 + N tokens) - time(1 token), both with
    the prompts already in the prefix cache, over N tokens per sequence."""
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, logit_bias=logit_bias)
    more = SamplingParams(temperature=0.0, max_tokens=1 + new_tokens, ignore_eos=True, logit_bias=logit_bias)
    llm.generate(prompts, one)  # prefill once: later runs hit the prefix cache
    t0 = time.perf_counter()
    llm.generate(prompts, one)
    t1 = time.perf_counter()
    outs = llm.generate(prompts, more)
    t2 = time.perf_counter()
    errors = [o.outputs[0].error for o in outs if o.outputs[0].error]
    made = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    dt = (t2 - t1) - (t1 - t0)
    return {
        "rows": len(prompts),
        "prompt_len": len(prompts[0]),
        "new_tokens": new_tokens,
        "decoded": made,
        "errors": errors,
        "one_token_s": t1 - t0,
        "with_decode_s": t2 - t1,
        "ms_per_step": dt * 1e3 / new_tokens,
        "tok_s": made / dt if dt > 0 else None,
    }
