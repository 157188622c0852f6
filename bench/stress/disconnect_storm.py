"""Long disconnect storm: `--streams` requests (default 1,000) dropped at random points, at most
`--concurrency` at once, against one loopback server over the synthetic engine.

    .venv/bin/python tests/stress/disconnect_storm.py --streams 1000

Afterwards: every KV block back (`check_integrity()`, 0 in use), no sequence in the engine, no
route in the dispatcher, no handler in flight, and the server answers. Exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from bench.lib.common import use_test_support

use_test_support()  # the raw HTTP client, engine hooks and attack libraries of tests/support
from rel_helpers import assert_all_released, assert_serves, served  # noqa: E402
from storm_lib import requested_tokens, storm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args()
    cfg = (f"model.synthetic_step_ms={args.step_ms}", "model.max_model_len=512", "scheduler.max_num_seqs=64")
    with served(*cfg) as (engine, srv):
        before = engine.stats()
        t0 = time.monotonic()
        outcomes = asyncio.run(storm(srv.port, engine.model_name, args.streams, args.seed, args.concurrency))
        wall = time.monotonic() - t0
        t1 = time.monotonic()
        assert_all_released(engine, srv)
        settle = time.monotonic() - t1
        after = engine.stats()
        assert_serves(srv, engine.model_name)
        assert_all_released(engine, srv)
        generated = after.generated_tokens - before.generated_tokens
        asked = requested_tokens(args.streams, args.seed)
        print(f"streams: {sum(outcomes.values())} in {wall:.1f} s; outcomes {dict(sorted(outcomes.items()))}")
        print(
            f"tokens generated {generated} of {asked} asked for; engine idle {settle:.2f} s after the storm"
        )
        print(
            f"after: kv_blocks_used {engine.stats().kv_blocks_used}/{after.kv_blocks_total}, "
            f"check_integrity ok, engine seqs {len(engine.core.seqs)}, "
            f"dispatcher routes {srv.state.dispatcher.active if srv.state.dispatcher else '?'}, "
            f"handlers in flight {srv.state.inflight}; server answers"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
