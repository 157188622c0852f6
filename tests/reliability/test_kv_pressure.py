"""256 concurrent long requests on a KV pool that holds ~5 of them: all complete, by preemption,
with the same greedy text as on a pool with room for all.

The synthetic engine's next token depends only on the prompt, the position and the choice, so any
difference (a token lost or repeated across a preemption, a mixed-up stream) is the serving
stack's. The same with the real model: tests/stress/kv_pressure.py --engine default.
"""

from __future__ import annotations

import asyncio

from pressure_lib import count_calls, hold_first_step, make_requests, run_all
from rel_helpers import assert_all_released, assert_serves, served

REQUESTS = 256
MAX_TOKENS = 160
COMMON = (
    "model.synthetic_step_ms=0",
    "model.max_model_len=512",
    "scheduler.max_num_seqs=64",
    "cache.block_size=16",
)
# 63 usable blocks x 16 tokens: room for ~5 requests of up to 200 tokens at their full length.
# Preemption is forced by arithmetic, not by timing: the first step is held until every request is
# in, so the next one admits as many prompts as fit (>= 21: a prompt of <= 40 tokens takes <= 3
# blocks) together, and any 6 of them at full length (>= 8 + 160 tokens = 11 blocks each) need 66.
STARVED = "cache.num_blocks=64"
ROOMY = "cache.num_blocks=4096"


def test_starved_pool_completes_everything_with_identical_outputs() -> None:
    requests = make_requests(REQUESTS, seed=7, max_tokens=MAX_TOKENS)
    with served(*COMMON, STARVED) as (engine, srv):
        preemptions = count_calls(engine.core.scheduler, "_preempt")
        hold_first_step(engine, REQUESTS)
        starved = asyncio.run(run_all(srv.port, engine.model_name, requests, timeout=120))
        print(f"starved pool: {preemptions()} preemptions for {REQUESTS} requests")
        assert preemptions() >= 1  # the pool really was too small
        assert_all_released(engine, srv)
        assert_serves(srv, engine.model_name)
    with served(*COMMON, ROOMY) as (engine, srv):
        preemptions = count_calls(engine.core.scheduler, "_preempt")
        roomy = asyncio.run(run_all(srv.port, engine.model_name, requests, timeout=120))
        assert preemptions() == 0
        assert_all_released(engine, srv)
    assert len(starved) == REQUESTS and all(starved)
    assert starved == roomy
