"""Where the 7B decode step's GPU time goes, on the GPU machine (a companion of check.py).

For each variant of the Inductor settings (`--variants`), builds the 7B-shape engine as check.py
does, then for batch 1 (context 256) and batch 64 (context 1024): the bare graph replay (CUDA
events), a kernel table of a few replays (torch.profiler: the kernels inside the graph), and a
host-side table of `ModelRunner.step` (CPU ops). Variants: `base` (as configured), `cdt`
(Inductor's coordinate-descent tuning on: it also turns a 1-row matmul into a tuned Triton GEMV).

    bash bench/gpu/run.sh --profile [--variants base cdt]      (on the GPU machine)
    .venv/bin/python bench/gpu_profile.py --cpu-smoke             (here: tiny shapes, eager)

Writes `gpu_profile.json` beside gpu_check.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from rillet.graphs.buckets import select_bucket

from bench.gpu.parts import open_engine
from bench.gpu.plan import free_memory, make_plan
from bench.gpu.timing import decode_batch, elapsed_ms, sync
from bench.lib.common import OUT


def _time(ev: Any, self_only: bool) -> float:
    names = (
        ("self_device_time_total", "self_cuda_time_total")
        if self_only
        else ("device_time_total", "cuda_time_total")
    )
    for n in names:
        if hasattr(ev, n):
            return float(getattr(ev, n))
    return 0.0


def kernel_table(prof: Any, reps: int, top: int = 18) -> dict[str, Any]:
    """Device kernels of the profiled region, per replay: name, calls, µs."""
    rows = []
    for ev in prof.key_averages():
        us = _time(ev, True)
        if us <= 0:
            continue
        rows.append({"kernel": ev.key[:90], "calls": ev.count // reps, "us": us / reps})
    rows.sort(key=lambda r: -r["us"])
    total = sum(r["us"] for r in rows)
    return {"total_us": total, "kernels": len(rows), "top": rows[:top]}


def host_table(prof: Any, reps: int, top: int = 15) -> list[dict[str, Any]]:
    rows = [
        {"op": ev.key[:70], "calls": ev.count // reps, "cpu_us": ev.self_cpu_time_total / reps}
        for ev in prof.key_averages()
        if ev.self_cpu_time_total > 0
    ]
    rows.sort(key=lambda r: -r["cpu_us"])
    return rows[:top]


@torch.inference_mode()
def profile_rows(llm: Any, rows: int, context: int, reps: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    runner: Any = llm.engine.runtime.runner
    device = runner.device
    num_blocks = runner.kv_caches[0][0].shape[0]
    batch = decode_batch(
        rows, context, llm.engine.cfg.cache.block_size, num_blocks, runner.model.arch.vocab_size
    )
    for _ in range(3):
        runner.step(batch)
    sync(device)
    out: dict[str, Any] = {"rows": rows, "context": context}
    t0 = time.perf_counter()
    for _ in range(reps):
        runner.step(batch)
    out["step_ms"] = (time.perf_counter() - t0) * 1e3 / reps
    gr = runner.graph_runner
    bucket = select_bucket(rows, gr.buckets) if gr is not None else None
    graph = gr._graphs.get(bucket) if gr is not None and bucket is not None else None
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if graph is not None:
        runner.step(batch)
        out["replay_ms"] = elapsed_ms(graph.replay, device, reps=reps)
        with profile(activities=acts) as prof:
            for _ in range(reps):
                graph.replay()
            sync(device)
        out["replay_kernels"] = kernel_table(prof, reps)
    with profile(activities=acts) as prof:
        for _ in range(reps):
            runner.step(batch)
        sync(device)
    out["step_kernels"] = kernel_table(prof, reps)
    out["step_host"] = host_table(prof, reps)
    for s in batch.seqs:
        runner.release(s)
    return out


def set_variant(name: str) -> None:
    import torch._inductor.config as ic

    ic.coordinate_descent_tuning = name == "cdt"


def run_variant(p: Any, name: str, cpu: bool) -> dict[str, Any]:
    set_variant(name)
    t0 = time.perf_counter()
    llm = open_engine(p, "7B", graphs=True)
    res: dict[str, Any] = {"variant": name, "build_s": time.perf_counter() - t0}
    try:
        for rows, ctx in ((1, p.b_context), (p.c_rows, p.c_context)):
            res[f"b{rows}"] = profile_rows(llm, rows, ctx, reps=p.iters if not cpu else 2)
    finally:
        llm.close()
        free_memory(p)
    return res


def print_variant(r: dict[str, Any]) -> None:
    print(f"\n=== variant {r['variant']}: build {r['build_s']:.1f} s")
    for key in ("b1", "b64", "b4"):
        m = r.get(key)
        if not m:
            continue
        rk = m.get("replay_kernels", {})
        kernels_ms = rk.get("total_us", 0) / 1e3
        replay = m.get("replay_ms", float("nan"))
        print(
            f"--- rows {m['rows']} ctx {m['context']}: step {m['step_ms']:.3f} ms, replay {replay:.3f} ms,"
            f" kernels in replay {kernels_ms:.3f} ms ({rk.get('kernels', 0)} distinct)"
        )
        for k in rk.get("top", []):
            print(f"   {k['us']:9.1f} us  x{k['calls']:<4d} {k['kernel']}")
        print(
            "   step, device kernels outside/inside the graph:",
            f"{m['step_kernels']['total_us'] / 1e3:.3f} ms; host ops:",
        )
        for h in m["step_host"][:10]:
            print(f"   {h['cpu_us']:9.1f} us  x{h['calls']:<4d} {h['op']}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", default=["base", "cdt"])
    ap.add_argument("--out", default=str(OUT / "gpu_profile.json"))
    ap.add_argument("--cpu-smoke", action="store_true")
    a = ap.parse_args()
    p = make_plan(a.cpu_smoke, None)
    results = []
    for v in a.variants:
        try:
            r = run_variant(p, v, a.cpu_smoke)
        except Exception as exc:  # the next variant still runs
            r = {"variant": v, "error": f"{type(exc).__name__}: {exc}"}
            print(r)
        results.append(r)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=1))
        if "error" not in r:
            print_variant(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
