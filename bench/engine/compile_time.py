"""Start-up with the compiled CPU decode step: cold vs warm (cached) compile, default model.

Each run is a fresh process (nothing in memory carries over). "cold" points Inductor's on-disk
caches (FX graph, AOTAutograd) at an empty folder; "warm" runs again on the folder the cold run
filled, as a restart of the server would. Per run: seconds from process start to the engine being
ready and to the first generated token (served eager while the step compiles in the background),
the compile of each graph (rows >= 2, rows == 1) and in all, the latency of 1-token requests sent
every 0.5 s while it compiles (median, max), the decode step's ms/token at batch 1 once compiled,
and peak RSS. Prints a table last, writes JSON.

    .venv/bin/python bench/compile_time.py [--set model.quantization=none]
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

from bench.lib.common import REPO

START = time.perf_counter()  # process start, as near as a script gets


def child(overrides: list[str]) -> dict[str, object]:
    from rillet.core.config import config_from_dict
    from rillet.core.llm import LLM
    from rillet.core.sampling_params import SamplingParams

    from bench.lib.common import peak_rss_mib

    cfg = config_from_dict({"model": {"device": "cpu"}, "cache": {"num_blocks": 256}}, overrides)
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
        return {
            "ready_s": ready,
            "first_token_s": first_token,
            "compiled_at_s": compiled_at,
            "meanwhile_1tok_p50_s": statistics.median(waits) if waits else None,
            "meanwhile_1tok_max_s": max(waits, default=None),
            "compile_s": gr.compiled.seconds,
            "decode": "compiled" if gr.compiled.ready else f"eager ({gr.compiled.failed})",
            "ms_per_token_b1": ms,
            "peak_rss_mib": peak_rss_mib(),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", action="append", default=[], help="rillet config override")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="bench/out/compile_time.json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.set)))
        return
    from bench.lib.common import table, write_json

    rows = []
    with tempfile.TemporaryDirectory(prefix="rillet-compile-") as cache:
        for run in ("cold", "warm"):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            cmd = [
                sys.executable,
                "-m",
                "bench.engine.compile_time",
                "--child",
                *[f"--set={s}" for s in a.set],
            ]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=REPO).stdout
            r = json.loads(out.strip().splitlines()[-1])
            compile_s = r.pop("compile_s")
            rows.append({"run": run, **r, **{f"compile {k} s": v for k, v in compile_s.items()}})
    write_json(a.out, {"overrides": a.set, "rows": rows})
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
