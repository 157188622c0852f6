"""Do slow readers cost the others inter-token latency? Paired trials on the synthetic engine.

A trial runs 8 normal streams (100 tokens, read at once) beside 4 extra streams of 8 choices
each, whose clients read promptly (baseline) or slowly (256 B every 50 ms through a 4 KB
receive buffer: their sockets fill and their backlog grows). Per trial: the median over the
normal streams of their median inter-token gap. Baseline and slow trials alternate, so both see
the same machine state; the ratio slow / baseline is the cost (target: <= 1.10).
tests/reliability/test_backpressure.py proves the mechanism behind it by counting (a stuck
stream costs no formatting, write or wake-up per token); this measures the time.

    .venv/bin/python bench/slow_readers.py [--pairs 3] [--out bench/out/slow_readers.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from typing import Any

from bench.lib.common import OUT, peak_rss_mib, table, use_test_support, write_json

use_test_support()  # the raw HTTP client and the engine checks of tests/support
from rel_helpers import COMP, assert_all_released, send, served  # noqa: E402

CONFIG = (
    "model.synthetic_step_ms=10",
    "model.max_model_len=1024",
    "scheduler.max_num_seqs=128",
    "stream.max_buffered_tokens=100000",  # the slow readers stay (slow) for the whole trial
)
NORMAL = 8
EXTRA = 4


async def _normal(port: int, model: str, i: int) -> float:
    body = {"model": model, "prompt": f"normal {i}", "max_tokens": 100, "ignore_eos": True, "stream": True}
    raw = await send(port, COMP, body)
    await raw.read_head()
    times = [t async for t, e in raw.events() if e != "[DONE]" and e["choices"][0]["text"]]
    raw.close()
    return statistics.median(b - a for a, b in itertools.pairwise(times))


async def _extra(port: int, model: str, i: int, slow: bool, stop: asyncio.Event) -> None:
    body = {"model": model, "prompt": f"extra {i}", "max_tokens": 900, "n": 8, "ignore_eos": True}
    buf = 4096 if slow else None
    raw = await send(port, COMP, {**body, "stream": True}, rcvbuf=buf, limit=buf or 2**16)
    try:
        while not stop.is_set():
            if slow:
                await raw.reader.read(256)  # ~5 KB/s against ~160 KB/s produced
                await asyncio.sleep(0.05)
            elif not await raw.reader.read(1 << 16):
                return
    finally:
        raw.close()


async def _trial(srv: Any, model: str, slow: bool) -> tuple[float, int]:
    """(median inter-token gap of the normal streams in s, largest backlog of an extra in tokens)."""
    stop = asyncio.Event()
    extras = [asyncio.create_task(_extra(srv.port, model, i, slow, stop)) for i in range(EXTRA)]
    await asyncio.sleep(1.0)  # slow extras: their sockets fill and their backlog starts growing
    itls = await asyncio.gather(*(_normal(srv.port, model, i) for i in range(NORMAL)))
    disp = srv.state.dispatcher
    backlog = max((s.pending_tokens for s, _ in disp._routes.values()), default=0)
    stop.set()
    await asyncio.gather(*extras)
    return statistics.median(itls), backlog


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default=str(OUT / "slow_readers.json"))
    args = ap.parse_args()
    rows = []
    t0 = time.monotonic()
    with served(*CONFIG) as (engine, srv):
        for pair in range(args.pairs):
            base, _ = asyncio.run(_trial(srv, engine.model_name, slow=False))
            assert_all_released(engine, srv)
            loaded, backlog = asyncio.run(_trial(srv, engine.model_name, slow=True))
            assert_all_released(engine, srv)
            rows.append(
                {
                    "pair": pair,
                    "itl_baseline_ms": base * 1e3,
                    "itl_beside_slow_ms": loaded * 1e3,
                    "ratio": loaded / base,
                    "slow_backlog_tokens": backlog,
                }
            )
    summary = {
        "median_ratio": statistics.median(r["ratio"] for r in rows),
        "best_ratio": min(r["ratio"] for r in rows),
        "target_ratio": 1.10,
        "peak_rss_mib": peak_rss_mib(),
        "seconds": time.monotonic() - t0,
    }
    write_json(args.out, {"config": list(CONFIG), "rows": rows, "summary": summary})
    print(f"wrote {args.out}")
    print(f"memory / time: peak RSS {summary['peak_rss_mib']:.0f} MiB, {summary['seconds']:.0f} s")
    print(table(rows, ["pair", "itl_baseline_ms", "itl_beside_slow_ms", "ratio", "slow_backlog_tokens"]))


if __name__ == "__main__":
    main()
