"""The GPU check's speculative-decoding parts: (e) what a verify step costs against a plain decode
step, and (f) the engine with n-gram drafts on the GPU (captured verify graphs, flashinfer's
multi-query attention) giving the tokens an eager engine without drafts gives.

(e):
Random weights accept no draft, so only the cost side is measured: on the 7B engine the check
built (flashinfer attention, CUDA graphs), the bare forward of a verify step with k = 1, 2, 4, 8
draft tokens per row (Q = 1 + k queries, graphs/interface.py VerifyBatch, planned by the
backend's begin_verify) beside a decode step's, both captured into CUDA graphs here (eager, not
compiled: the same conditions for both) at batch 1 and 16 over a random context. The ratio
verify / decode is the price of one step that may yield up to 1 + k tokens. On the CPU (a smoke
run) the same forwards are timed eager.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rillet.core.llm import LLM
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.interface import DecodeBatch, VerifyBatch

from bench.gpu.greedy import compare_greedy
from bench.gpu.parts import graph_stats, open_engine
from bench.gpu.plan import LOGPROB_TOL, TIE_TOL, Part, Plan, free_memory, row, verdict
from bench.gpu.timing import elapsed_ms, engine_decode_rate, random_ids, sync

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


def alphabet_requests(
    vocab: int, lens: Sequence[int], seed: int
) -> tuple[list[list[int]], tuple[tuple[int, float], ...]]:
    """Prompts over an alphabet of 8 random tokens, and a logit_bias of +100 on each of them.
    Random weights never repeat their prompt, so n-gram lookup would propose nothing; with the
    bias every output token is one of the 8 and the drafter finds a match at nearly every step.
    The model's own logits still choose among the 8 (the bias is the same for each), so drafts
    are accepted and refused."""
    gen = torch.Generator().manual_seed(seed)
    alphabet = random_ids(8, vocab, gen)
    pick = torch.randint(0, len(alphabet), (max(lens),), generator=gen).tolist()
    return [[alphabet[i] for i in pick[:n]] for n in lens], tuple((t, 100.0) for t in alphabet)


def speed_requests(p: Plan) -> tuple[list[list[int]], tuple[tuple[int, float], ...]]:
    """(g)'s batch-1 request, the same for the plain engine in (e) and the drafting one in (g)."""
    return alphabet_requests(p.big_arch.vocab_size, (p.b_prompt,), 17)


def part_spec(p: Plan, llm: Any) -> Part:
    """(e) A verify step's forward with k draft tokens a row against a decode step's, batch 1 and
    16. INFO: the price of a step that may yield up to 1 + k tokens. Also the plain engine's
    batch-1 decode rate on (g)'s requests, which (g) compares its drafting engine with."""
    data = verify_cost(llm, p.b_context, p.iters)
    prompts, bias = speed_requests(p)
    data["alphabet_plain"] = engine_decode_rate(llm, prompts, p.b_new, bias)
    rows = [
        row(
            f"(e) b={s['rows']} k={s['k']}",
            f"{s['verify_ms']:.2f} ms",
            "",
            f"decode {s['decode_ms']:.2f} ms",
            "INFO",
            f"x{s['ratio']:.2f} of a decode step",
        )
        for s in data["steps"]
    ]
    return Part(data, rows, data["alphabet_plain"])


def part_spec_speed(p: Plan, plain: dict[str, Any] | None) -> Part:
    """(g) The 7B engine with n-gram drafts (the method's defaults), graphs on: batch-1 decode
    rate on the alphabet requests against the plain engine's (measured in (e)). INFO: random
    weights make the acceptance whatever it is; the row says it."""
    prompts, bias = speed_requests(p)
    llm = open_engine(p, "7B", True, extra=("speculative.method=ngram",))
    try:
        t0 = time.perf_counter()
        rate = engine_decode_rate(llm, prompts, p.b_new, bias)
        assert llm.engine.core.spec is not None
        stats = llm.engine.core.spec.stats
        verify_runs = graph_stats(llm).get("verify_runs", 0)
        secs = time.perf_counter() - t0
    finally:
        llm.close()
        free_memory(p)
    rate_ms, plain_ms = rate["ms_per_step"], (plain or {}).get("ms_per_step")
    speedup = plain_ms / rate_ms if plain_ms and rate_ms > 0 else None
    acc = stats.accepted / stats.drafted if stats.drafted else 0.0
    counts = {"drafted": stats.drafted, "accepted": stats.accepted, "verified": stats.verified}
    data = {
        "spec": rate,
        "plain": plain,
        "speedup": speedup,
        **counts,
        "verify_runs": verify_runs,
        "seconds": secs,
    }
    ref = f"plain {plain_ms:.2f} ms/tok" if plain_ms else "plain: not measured"
    note = f"x{speedup or 0:.2f}; accepted {stats.accepted}/{stats.drafted} ({acc:.0%})"
    note += f"; {verify_runs} verify runs"
    return Part(data, [row("(g) b=1 ngram 7B", f"{rate_ms:.2f} ms/tok", "", ref, "INFO", note)])


# Every proposed token is verified (row_cost 0) and up to 4 rows draft, so the captured verify
# graphs of several buckets run; Q = 1 + 4.
SPEC_OVERRIDES = (
    "speculative.method=ngram",
    "speculative.num_tokens=4",
    "speculative.max_batch=4",
    "speculative.row_cost=0.0",
)


def part_spec_engine(p: Plan) -> Part:
    """(f) Greedy tokens of the default shape's engine with n-gram drafts, graphs on, against an
    eager engine without drafts, on alphabet_requests (drafts proposed at nearly every step)."""
    spec = eager = None
    prompts, bias = alphabet_requests(p.small_arch.vocab_size, p.greedy_lens, 7)
    params = [
        SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=5, logit_bias=bias)
        for m in p.greedy_max_tokens
    ]
    try:
        spec = open_engine(p, "default", True, extra=SPEC_OVERRIDES)
        eager = open_engine(p, "default", graphs=False)
        got = [r.outputs[0] for r in spec.generate(prompts, params)]
        want = [r.outputs[0] for r in eager.generate(prompts, params)]
        stats = spec.engine.core.spec.stats if spec.engine.core.spec is not None else None
        graphs = graph_stats(spec)
    finally:
        for llm in (spec, eager):
            if llm is not None:
                llm.close()
        free_memory(p)
    r = compare_greedy(want, got, TIE_TOL, LOGPROB_TOL)
    drafted, accepted = (stats.drafted, stats.accepted) if stats is not None else (0, 0)
    verify_runs = graphs.get("verify_runs", 0)
    ok = r["ok"] and drafted > 0 and (verify_runs > 0 or p.device != "cuda")
    measured = f"{r['exact']}/{r['prompts']} exact, {r['tie']} ties"
    note = f"{verify_runs} verify graph runs; drafted {drafted}, accepted {accepted}"
    data = {**r, "drafted": drafted, "accepted": accepted, "verify_runs": verify_runs, "graphs": graphs}
    return Part(data, [row("(f) spec engine", measured, "equal", "eager, no drafts", verdict(ok), note)])
