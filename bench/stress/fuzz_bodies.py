"""Long fuzzing run: `--cases` hostile bodies (default 10,000) split over the four generation
endpoints (chat, completions, /v1/responses, /v1/messages) and both families (random JSON,
almost-valid), and /tokenize and /detokenize (one mixed family each), through one loopback
server; prints the status histogram.

    .venv/bin/python -m bench.stress.fuzz_bodies --cases 10000
    .venv/bin/python -m bench.stress.fuzz_bodies --cases 2000 --engine tiny   # real sampler path

`--engine tiny` serves a random-weight 2-layer model (`model.kind=shape`, `model.shape=tiny`), so
sampling parameters reach a real sampler instead of the synthetic engine. Exit status 1 on any
violation (a 5xx, a malformed error, a broken stream, a leak afterwards).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench.lib.common import use_test_support

use_test_support()  # the raw HTTP client, engine hooks and attack libraries of tests/support
from fuzzing.api_bodies import almost_valid_api_body, random_api_body  # noqa: E402
from fuzzing.chat_bodies import almost_valid_body, random_body  # noqa: E402
from fuzzing.client import Client  # noqa: E402
from fuzzing.tokenize_bodies import DETOKENIZE, TOKENIZE, tokenize_body  # noqa: E402
from fuzzing.values import MESSAGES, RESPONSES  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from rel_helpers import CHAT, COMP, assert_all_released, assert_serves, served  # noqa: E402

BASE = [
    "model.max_model_len=128",
    "server.max_tokens_cap=8",
    "server.default_max_tokens=8",
    "server.max_n=4",
    "scheduler.max_waiting=4096",
]
ENGINES = {
    "synthetic": ["model.synthetic_step_ms=0"],
    "tiny": ["model.kind=shape", "model.shape=tiny", "cache.num_blocks=512"],
}


def fuzz(client: Client, path: str, family: Any, cases: int, seed_value: int | None) -> None:
    @settings(max_examples=cases, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=family)
    def run(body: bytes) -> None:
        client.check(path, body)

    if seed_value is not None:
        run = seed(seed_value)(run)
    run()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--engine", choices=sorted(ENGINES), default="synthetic")
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    args = ap.parse_args()
    t0 = time.monotonic()
    with served(*BASE, *ENGINES[args.engine]) as (engine, srv):
        model = engine.model_name
        client = Client(srv.host, srv.port)
        families = {
            CHAT: (random_body("chat"), almost_valid_body("chat", model)),
            COMP: (random_body("completion"), almost_valid_body("completion", model)),
            RESPONSES: (random_api_body("responses"), almost_valid_api_body("responses", model)),
            MESSAGES: (random_api_body("messages"), almost_valid_api_body("messages", model)),
            TOKENIZE: (tokenize_body(TOKENIZE, model),),
            DETOKENIZE: (tokenize_body(DETOKENIZE, model),),
        }
        per_run = max(1, args.cases // sum(map(len, families.values())))
        for path, pair in families.items():
            for family in pair:
                fuzz(client, path, family, per_run, args.seed)
                print(f"{path}: {client.cases} cases so far, {time.monotonic() - t0:.0f} s", flush=True)
        client.close()
        assert_all_released(engine, srv)
        assert_serves(srv, model)
    statuses = dict(sorted(client.statuses.items()))
    print(f"fuzz ({args.engine}): {client.cases} cases in {time.monotonic() - t0:.0f} s; statuses {statuses}")
    print("no 5xx, every 4xx in its API's error shape, streams well-formed, pool whole, server serving")
    return 0


if __name__ == "__main__":
    sys.exit(main())
