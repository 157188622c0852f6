"""Start-up with the compiled CPU decode step, default model: cold, warm, warm after a pool change.

Each run is a fresh process (nothing in memory carries over) over one cache folder per series
(`model.cache_dir`: the saved steps, and Inductor's own caches under it):
  cold        an empty folder: the saved step is built (graphs.artifacts on: by a niced child
              process; off: torch.compile on a thread of the engine's process)
  warm        the folder the cold run filled: a restart
  warm+blocks the same, with another `cache.num_blocks` (the pool size is an input of a saved
              step: nothing is built again)
With --variant KEY=VALUE (e.g. cache.dtype=int8) the series is instead: cold, the variant (its
own steps built), then warm: the first config again, whose saved steps the variant's must not
have deleted (a config switch and back).
Series: `artifacts` (graphs.artifacts on, the default) and, with --baseline, `torch.compile`
(graphs.artifacts off: what came before, for the same run).

Per run: seconds from process start to the engine being ready, to the first generated token
(served eager while the step is built), and to the compiled step in use; how the step was
obtained; the latency of 1-token requests sent every 0.5 s until then (p50, p99, max: what a user
sees during a cold compile); the decode step's ms/token at batch 1 once compiled; peak and final
RSS. Prints a table last, writes JSON.

    nice -n 19 .venv/bin/python -m bench.engine.compile_time [--baseline] [--variant KEY=VALUE]
        [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib.common import REPO

START = time.perf_counter()  # process start, as near as a script gets
BLOCKS, OTHER_BLOCKS = 256, 320


def child(overrides: list[str]) -> dict[str, object]:
    from rillet.core.config import config_from_dict
    from rillet.core.llm import LLM
    from rillet.core.sampling_params import SamplingParams

    from bench.lib.common import peak_rss_mib

    cfg = config_from_dict({"model": {"device": "cpu"}, "cache": {"num_blocks": BLOCKS}}, overrides)
    with LLM(cfg) as llm:
        ready = time.perf_counter() - START
        one = SamplingParams(max_tokens=1, temperature=0.0)
        llm.generate(["Hello"], one)
        first_token = time.perf_counter() - START
        gr = llm.engine.core.runner.graph_runner  # type: ignore[attr-defined]
        assert gr is not None and gr.compiled is not None, "the decode step is not compiled here"
        waits = []  # 1-token requests while the step compiles: what a user sees meanwhile
        while not gr.compiled.wait(0.5):
            t0 = time.perf_counter()
            llm.generate(["Hello"], one)
            waits.append(time.perf_counter() - t0)
        compiled_at = time.perf_counter() - START
        params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
        llm.generate(["Write a short story about a robot."], params)  # warm-up
        t0 = time.perf_counter()
        out = llm.generate(["Write a short poem about the sea."], params)
        ms = (time.perf_counter() - t0) * 1e3 / len(out[0].outputs[0].token_ids)
        seconds = gr.compiled.seconds
        how = "loaded" if "lookup" in seconds else ("built" if "build" in seconds else "torch.compile")
        return {
            "ready_s": ready,
            "first_token_s": first_token,
            "compiled_at_s": compiled_at,
            "step": how,
            "meanwhile_n": len(waits),
            "meanwhile_1tok_p50_s": statistics.median(waits) if waits else None,
            "meanwhile_1tok_p99_s": _quantile(waits, 0.99),
            "meanwhile_1tok_max_s": max(waits, default=None),
            "compile_s": seconds,
            "decode": "compiled" if gr.compiled.ready else f"eager ({gr.compiled.failed})",
            "ms_per_token_b1": ms,
            "peak_rss_mib": peak_rss_mib(),
            "final_rss_mib": _rss_mib(),
        }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def runs(variant: str | None) -> list[tuple[str, list[str]]]:
    if variant is not None:
        return [("cold", []), (f"cold {variant}", [variant]), ("warm after it", [])]
    return [("cold", []), ("warm", []), ("warm+blocks", [f"cache.num_blocks={OTHER_BLOCKS}"])]


def run_series(name: str, overrides: list[str], variant: str | None = None) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="rillet-compile-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(cache) / "inductor")}
        base = [*overrides, f"model.cache_dir={cache}"]
        for run, extra in runs(variant):
            cmd = [sys.executable, "-m", "bench.engine.compile_time", "--child"]
            cmd += [f"--set={s}" for s in [*base, *extra]]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{name} {run} failed:\n{done.stderr[-4000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            compile_s = r.pop("compile_s")
            rows.append({"series": name, "run": run, **r, **{f"{k} s": v for k, v in compile_s.items()}})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", action="append", default=[], help="rillet config override")
    ap.add_argument("--baseline", action="store_true", help="also graphs.artifacts off (torch.compile)")
    ap.add_argument("--variant", help="KEY=VALUE: cold, cold with it, then warm without (a switch back)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench/out/compile_time.json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.set)))
        return
    from bench.lib.common import table, write_json

    rows = run_series("artifacts", [*a.set, "graphs.artifacts=on"], a.variant)
    if a.baseline:
        rows += run_series("torch.compile", [*a.set, "graphs.artifacts=off"], a.variant)
    write_json(a.out, {"overrides": a.set, "variant": a.variant, "rows": rows})
    cols = sorted({c for r in rows for c in r}, key=lambda c: next(i for i, r in enumerate(rows) if c in r))
    print(table(rows, cols))


if __name__ == "__main__":
    main()
