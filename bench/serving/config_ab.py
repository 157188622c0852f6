"""Two or more server configs side by side, batches interleaved: is a setting faster, streaming or not?

On this shared 2-core VM the same batch runs ~10 % faster or slower from one minute to the next,
so configs measured one after another differ by the drift. Here every config has its own
`rillet serve` (all loaded at once; an idle one costs nothing) and each round runs, per config,
one non-streaming and one streaming batch of C concurrent requests (the `openai` client, as in
stream_vs_nonstream.py), the order of configs and of modes alternating from round to round.
Per config it reports tok/s of both modes, the streaming ratio, and each mode's speed relative
to the first config as the median of per-round ratios (batches minutes apart never compared).

    python bench/config_ab.py --config off=stream.handoff=off --config on=stream.handoff=on \\
        --concurrency 1 8 --rounds 6

Prints a table last and writes JSON (with each server's peak RSS).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from typing import Any

import openai

from bench.lib.common import table, write_json
from bench.lib.server_proc import RilletServer
from bench.lib.timed_batch import run_batch


def parse_config(text: str) -> tuple[str, list[str]]:
    name, _, sets = text.partition("=")
    if not name or not sets:
        raise argparse.ArgumentTypeError(f"--config wants NAME=key=value[,key=value...], got {text!r}")
    return name, sets.split(",")


def level(servers: dict[str, RilletServer], c: int, rounds: int, max_tokens: int) -> list[dict[str, Any]]:
    clients = {
        k: [
            openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0, timeout=600) for _ in range(c)
        ]
        for k, s in servers.items()
    }
    models = {k: cl[0].models.list().data[0].id for k, cl in clients.items()}
    for k in servers:  # warm-up
        run_batch(clients[k], models[k], False, 8)
        run_batch(clients[k], models[k], True, 8)
    names = list(servers)
    rates: dict[tuple[str, bool], list[float]] = {(k, s): [] for k in names for s in (False, True)}
    for r in range(rounds):
        for i, k in enumerate(names if r % 2 == 0 else names[::-1]):
            for stream in (False, True) if (r + i) % 2 == 0 else (True, False):
                b = run_batch(clients[k], models[k], stream, max_tokens)
                rates[(k, stream)].append(b.tokens / b.wall_s)
        print(f"  c={c} round {r + 1}/{rounds} done", file=sys.stderr)
    return [row(k, c, rates, names[0]) for k in names]


def row(k: str, c: int, rates: dict[tuple[str, bool], list[float]], base: str) -> dict[str, Any]:
    n, s = rates[(k, False)], rates[(k, True)]

    def vs_base(stream: bool) -> float:
        return statistics.median(
            a / b for a, b in zip(rates[(k, stream)], rates[(base, stream)], strict=True)
        )

    return {
        "config": k,
        "concurrency": c,
        "nonstream_tok_s": statistics.mean(n),
        "stream_tok_s": statistics.mean(s),
        "ratio": statistics.mean(s) / statistics.mean(n),
        "median_pair_ratio": statistics.median(b / a for a, b in zip(n, s, strict=True)),
        "nonstream_vs_first": vs_base(False),
        "stream_vs_first": vs_base(True),
        "nonstream_batches": n,
        "stream_batches": s,
    }


COLUMNS = {  # JSON key -> table column
    "config": "config",
    "concurrency": "concurrency",
    "nonstream_tok_s": "non-stream tok/s",
    "stream_tok_s": "stream tok/s",
    "ratio": "ratio",
    "median_pair_ratio": "median pair ratio",
    "nonstream_vs_first": "non-stream vs first",
    "stream_vs_first": "stream vs first",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=parse_config, action="append", required=True, help="NAME=key=value,...")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--out", default="bench/out/config_ab.json")
    args = ap.parse_args()
    configs = dict(args.config)
    with contextlib.ExitStack() as stack:
        servers = {k: stack.enter_context(RilletServer(sets)) for k, sets in configs.items()}
        rows = [r for c in args.concurrency for r in level(servers, c, args.rounds, args.max_tokens)]
        rss = {k: s.peak_rss_mib() for k, s in servers.items()}
    write_json(
        args.out,
        {
            "configs": configs,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "server_peak_rss_mib": rss,
            "rows": rows,
        },
    )
    print(f"{args.rounds} rounds, {args.max_tokens} tokens per request; peak RSS MiB {rss}; JSON: {args.out}")
    print(table([{label: r[key] for key, label in COLUMNS.items()} for r in rows], list(COLUMNS.values())))


if __name__ == "__main__":
    main()
