"""What kv_events costs the engine thread: the block manager's work per step with the event
recorder attached vs not, and the sender thread's packing per batch (docs/kv-events.md).

No model: a BlockManager driven as the engine drives it (core/engine/core.py `_launch`): a wave of
`--seqs` requests with prompts of `--prompt-len` tokens sharing a `--shared`-token prefix is
admitted and prefilled, then decoded `--tokens` steps, a commit whenever a block fills, then freed;
the pool is small enough that later waves evict earlier ones. Off and on alternate round by round
(best of `--rounds` each). "host us/step" is the block manager's time per decode step of the whole
batch (commits, grows, and with events on the recorder and the list swap the engine does per step);
"pack us/batch" is msgpack packing of one step's events, which runs on the sender thread.

    .venv/bin/python -m bench.observability.kv_events_cost [--seqs 32] [--prompt-len 512]
        [--shared 256] [--tokens 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import msgpack
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.kv_events.hashing import BlockHasher
from rillet.core.engine.kv_events.recorder import KVEventRecorder
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq

from bench.lib.common import machine, peak_rss_mib, table, write_json

BS = 16


def wave(
    bm: BlockManager, args: argparse.Namespace, rng: random.Random, first_id: int
) -> tuple[float, int, list]:
    """(seconds in the block manager, decode steps, every step's events)."""
    shared = [rng.randrange(3, 49000) for _ in range(args.shared)]
    seqs = [
        Seq(
            first_id + i,
            "r",
            shared + [rng.randrange(3, 49000) for _ in range(args.prompt_len - args.shared)],
            SamplingParams(max_tokens=args.tokens),
        )
        for i in range(args.seqs)
    ]
    rec = bm.events
    batches: list[list[Any]] = []
    t0 = time.perf_counter()
    for s in seqs:
        n = bm.admit(s, 10**9)
        assert n > 0, "pool too small for a wave"
        s.num_computed += n
        bm.commit(s)
    for _ in range(args.tokens):
        for s in seqs:
            s.output_ids.append(rng.randrange(3, 49000))
            assert bm.grow(s, s.num_computed + 1)
            s.num_computed += 1
            if s.num_computed % BS == 0:
                bm.commit(s)
        if rec is not None and rec.pending:
            batches.append(rec.take())
    for s in seqs:
        bm.free(s)
    return time.perf_counter() - t0, args.tokens, batches


def run(events: bool, args: argparse.Namespace, seed: int) -> tuple[float, float]:
    """(block-manager us per decode step, msgpack us per published batch)."""
    per_wave = args.seqs * -(-(args.prompt_len + args.tokens) // BS)
    bm = BlockManager(int(per_wave * 1.5) + 1, BS)  # room for one wave and half another: evictions
    if events:
        bm.events = KVEventRecorder(BS, BlockHasher("SmolLM2-135M-Instruct", "42"))
    rng = random.Random(seed)
    spent, steps, batches = 0.0, 0, []
    for w in range(3):
        s, n, b = wave(bm, args, rng, w * 10**6)
        spent, steps, batches = spent + s, steps + n, batches + b
    pack = 0.0
    if batches:
        t0 = time.perf_counter()
        for b in batches:
            msgpack.packb([time.time(), b, 0])
        pack = (time.perf_counter() - t0) / len(batches) * 1e6
    return spent / steps * 1e6, pack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--shared", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="bench/out/kv_events_cost.json")
    args = ap.parse_args()
    best: dict[bool, tuple[float, float]] = {}
    for r in range(args.rounds):
        for events in (False, True) if r % 2 == 0 else (True, False):
            us, pack = run(events, args, seed=r)
            prev = best.get(events)
            best[events] = (
                (min(us, prev[0]), min(pack, prev[1]) if prev and pack else pack) if prev else (us, pack)
            )
    rows = [
        {"events": "off", "host us/step": f"{best[False][0]:.1f}", "pack us/batch": "-"},
        {"events": "on", "host us/step": f"{best[True][0]:.1f}", "pack us/batch": f"{best[True][1]:.1f}"},
    ]
    extra = best[True][0] - best[False][0]
    write_json(
        args.out,
        {
            "args": vars(args),
            "machine": machine(),
            "off_us_per_step": best[False][0],
            "on_us_per_step": best[True][0],
            "pack_us_per_batch": best[True][1],
            "peak_rss_mib": peak_rss_mib(),
        },
    )
    print(f"batch of {args.seqs}: events add {extra:.1f} us of block-manager time per decode step")
    print(table(rows, ["events", "host us/step", "pack us/batch"]))


if __name__ == "__main__":
    main()
