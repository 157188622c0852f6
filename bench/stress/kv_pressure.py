"""KV-pool pressure, long form: `--requests` concurrent long greedy requests (default 256) on a pool
too small for them, then the same requests on a roomy pool; the texts must be identical.

    .venv/bin/python tests/stress/kv_pressure.py --requests 256 --max-tokens 400
    .venv/bin/python tests/stress/kv_pressure.py --engine default --requests 64 --max-tokens 32

`--engine synthetic` (default): no compute; tokens depend only on prompt, position and choice.
`--engine default`: the real SmolLM2-135M on CPU (slow: keep counts small). Float results can
differ with the batch a sequence ran in, so an argmax near-tie may flip a greedy token; the script
reports how many texts differ rather than asserting equality for the real model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from bench.lib.common import use_test_support

use_test_support()  # the raw HTTP client, engine hooks and attack libraries of tests/support
from pressure_lib import count_calls, make_requests, run_all  # noqa: E402
from rel_helpers import assert_all_released, assert_serves, served  # noqa: E402

ENGINES = {
    "synthetic": ["model.kind=synthetic", "model.synthetic_step_ms=0"],
    "default": ["model.kind=auto", "model.path=null", "model.num_threads=2"],
}


def run(
    engine_args: list[str], pool: int, requests: list[dict[str, object]], timeout: float
) -> tuple[list[str], int, float]:
    common = [
        *engine_args,
        "model.max_model_len=512",
        "scheduler.max_num_seqs=64",
        f"cache.num_blocks={pool}",
    ]
    with served(*common) as (engine, srv):
        preemptions = count_calls(engine.core.scheduler, "_preempt")
        t0 = time.monotonic()
        texts = asyncio.run(run_all(srv.port, engine.model_name, requests, timeout))
        wall = time.monotonic() - t0
        assert_all_released(engine, srv)
        assert_serves(srv, engine.model_name)
        return texts, preemptions(), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument(
        "--starved-blocks", type=int, default=64, help="KV blocks of 16 tokens (block 0 reserved)"
    )
    ap.add_argument("--engine", choices=sorted(ENGINES), default="synthetic")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    reqs = make_requests(args.requests, seed=11, max_tokens=args.max_tokens)
    engine_args = ENGINES[args.engine]
    starved, preempted, t_starved = run(engine_args, args.starved_blocks, reqs, args.timeout)
    roomy, preempted_roomy, t_roomy = run(engine_args, 8192, reqs, args.timeout)
    same = sum(a == b for a, b in zip(starved, roomy, strict=True))
    print(
        f"{args.requests} requests x {args.max_tokens} tokens ({args.engine}): "
        f"starved pool ({args.starved_blocks - 1} blocks) {t_starved:.1f} s, {preempted} preemptions; "
        f"roomy pool {t_roomy:.1f} s, {preempted_roomy} preemptions"
    )
    print(f"all {len(starved)} completed; identical greedy texts: {same}/{len(starved)}")
    ok = preempted > 0 and all(starved) and (same == len(starved) or args.engine != "synthetic")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
