"""Tensor parallelism on this CPU box: step time at TP=1 vs TP>1, and the communication per step.

For each (model, TP, batch): one engine in a fresh process (so peak RSS is its own), a warm-up
generate, then a timed generate; every runner step (launch + wait) is timed on rank 0 and the
decode steps (one new token per sequence) give the median decode step time. On rank 0 the
all-reduces are counted (calls and bytes per step) and the step broadcast's bytes too. Worker
RSS: the peak of the largest worker (RUSAGE_CHILDREN after they exit). Also: gloo all-reduce
latency by message size between two processes. float32, quantization none; model.num_threads =
2 / ranks (the ranks share this box's 2 cores): this shows the OVERHEAD of tensor parallelism,
not a speed-up.

    .venv/bin/python bench/tp_step.py [--tokens 24] [--batch 1 8] [--model smollm2-135m llama-1b-shape]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.lib.common import peak_rss_mib, table, write_json

PROMPT = "Write a short story about a robot who learns to paint, in the style of a fairy tale."
# (label, model overrides, TP sizes)
MODELS = [
    ("smollm2-135m", [], (1, 3)),
    ("llama-1b-shape", ["model.kind=shape", "model.shape=llama-1b"], (1, 2)),
]


def run_one(model_sets: list[str], tp: int, batch: int, tokens: int) -> dict[str, Any]:
    """In this process: one engine, timed steps, comm counts (rank 0's view)."""
    import torch
    from rillet.core.config import load_config
    from rillet.core.llm import LLM
    from rillet.core.sampling_params import SamplingParams

    threads = max(1, (os.cpu_count() or 2) // tp)
    sets = [
        *model_sets,
        "model.dtype=float32",
        "model.quantization=none",
        "model.max_model_len=512",
        "cache.num_blocks=256",
        f"model.num_threads={threads}",
        f"parallel.tensor_parallel_size={tp}",
    ]
    steps: list[tuple[bool, float, int, int, int]] = []  # (decode?, seconds, all-reduces, bytes, bcast)
    counts = {"ar": 0, "ar_bytes": 0, "bcast_bytes": 0}
    with LLM(load_config(None, sets)) as llm:
        rt = llm.engine.runtime
        if rt.cluster is not None:
            group = rt.cluster.group
            assert group is not None

            def counted_all_reduce(x: torch.Tensor, _f: Any = group.all_reduce) -> torch.Tensor:
                counts["ar"] += 1
                counts["ar_bytes"] += x.numel() * x.element_size()
                return _f(x)

            for layer in rt.runner.inner.model.layers:  # type: ignore[attr-defined]
                layer.all_reduce = counted_all_reduce
            inner = rt.runner.inner  # type: ignore[attr-defined]
            send = inner.publish_inputs

            def counted_send(inp: Any, _s: Any = send) -> None:
                from rillet.core.distributed import step_io

                counts["bcast_bytes"] += 8 * (step_io.HEADER + step_io.pack(inp).numel())
                _s(inp)

            inner.publish_inputs = counted_send
        core = llm.engine.core
        runner_launch = core.runner.launch

        class Landed:  # the launched step, already waited for (inside the timed span)
            def __init__(self, seqs: Any, result: Any) -> None:
                self.seqs, self.result = seqs, result

            def wait(self) -> Any:
                return self.result

        def timed(batch_: Any) -> Any:
            before = dict(counts)
            t0 = time.perf_counter()
            launched = runner_launch(batch_)
            out = Landed(launched.seqs, launched.wait())
            dt = time.perf_counter() - t0
            decode = all(n == 1 for n in batch_.num_new)
            steps.append(
                (
                    decode,
                    dt,
                    counts["ar"] - before["ar"],
                    counts["ar_bytes"] - before["ar_bytes"],
                    counts["bcast_bytes"] - before["bcast_bytes"],
                )
            )
            return out

        core.runner.launch = timed  # type: ignore[method-assign]
        prompts = [f"{i}. {PROMPT}" for i in range(batch)]
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        llm.generate(prompts, params)  # warm-up
        steps.clear()
        llm.generate([f"{batch + i}. {PROMPT}" for i in range(batch)], params)
        arch = rt.arch
    dec = [s for s in steps if s[0]]
    pre = [s for s in steps if not s[0]]
    return {
        "tp": tp,
        "batch": batch,
        "threads_per_rank": threads,
        "decode_step_ms": 1000 * statistics.median(s[1] for s in dec),
        "prefill_step_ms": 1000 * statistics.median(s[1] for s in pre) if pre else None,
        "decode_steps": len(dec),
        "all_reduces_per_step": dec[0][2],
        "bytes_per_all_reduce": dec[0][3] // dec[0][2] if dec[0][2] else 0,
        "all_reduce_bytes_per_step": dec[0][3],
        "broadcast_bytes_per_step": dec[0][4],
        "layers": arch.num_layers if arch else None,
        "hidden": arch.hidden_size if arch else None,
        "rank0_rss_mib": peak_rss_mib(),
        "worker_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 if tp > 1 else None,
    }


def _latency_rank(rank: int, port: int, sizes: list[int], out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    name = dist.group.WORLD.group_name  # type: ignore[union-attr]
    res = {}
    for n in sizes:
        x = torch.ones(n // 4)
        for _ in range(20):
            torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", name))
        reps = 200
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", name))
        res[n] = (time.perf_counter() - t0) / reps * 1e6
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(res))


def gloo_latency(sizes: list[int]) -> dict[str, float]:
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        mp.spawn(_latency_rank, args=(port, sizes, f.name), nprocs=2)
        data: dict[str, float] = json.loads(Path(f.name).read_text())
        return data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--model", nargs="+", default=[m[0] for m in MODELS], help="labels of MODELS to run")
    ap.add_argument("--out", default="bench/out/tp_step.json")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: JSON args of one run
    args = ap.parse_args()
    if args.one:
        spec = json.loads(args.one)
        sys.stdout.write(json.dumps(run_one(spec["sets"], spec["tp"], spec["batch"], args.tokens)) + "\n")
        return
    rows = []
    for label, sets, sizes in [m for m in MODELS if m[0] in args.model]:
        for batch in args.batch:
            for tp in sizes:
                spec = json.dumps({"sets": sets, "tp": tp, "batch": batch})
                cmd = [sys.executable, __file__, "--tokens", str(args.tokens), "--one", spec]
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    sys.stderr.write(done.stderr[-3000:])
                    raise SystemExit(f"{label} tp={tp} batch={batch} failed")
                rows.append({"model": label, **json.loads(done.stdout.strip().splitlines()[-1])})
                sys.stderr.write(f"{rows[-1]}\n")
    latency = gloo_latency([2304, 8192, 65536, 1 << 20])
    write_json(args.out, {"runs": rows, "gloo_all_reduce_us_by_bytes": latency})
    for n, us in latency.items():
        print(f"gloo all-reduce, 2 processes, {int(n):>8} bytes: {us:8.1f} us")
    cols = [
        "model",
        "tp",
        "batch",
        "decode_step_ms",
        "prefill_step_ms",
        "all_reduces_per_step",
        "bytes_per_all_reduce",
        "broadcast_bytes_per_step",
        "rank0_rss_mib",
        "worker_rss_mib",
    ]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
