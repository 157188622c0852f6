"""Decode tok/s of an MoE model against dense models of the same active and of the same total size.

Shapes (core/model/shapes.py, random weights, the default model's vocabulary): `moe-8x1k` (12
layers, hidden 1024, 8 experts of 1024, top-2), `moe-8x1k-dense-active` (the same with one dense
MLP of 2 x 1024: the MoE's active compute per token) and `moe-8x1k-dense-total` (8 x 1024: every
expert's weights). The expert dispatch costs no more than its active compute when the MoE decodes
at about the dense-active speed at batch 1 (each token reads 2 experts); at batch 16 its tokens
touch most of the 8 experts, so the bytes read per step approach dense-total's: between the two.

Each (shape, batch) runs in a fresh process: the engine with the compiled decode step (waited for),
one warm-up round, then `--rounds` rounds of `batch` prompts of `--new` tokens each; tok/s is the
generated tokens over the wall time of the timed rounds. Peak RSS per process. Table last, JSON.

    .venv/bin/python -m bench.engine.moe_dispatch                      # float32, compiled
    .venv/bin/python -m bench.engine.moe_dispatch --set model.quantization=int4
    .venv/bin/python -m bench.engine.moe_dispatch --batches 1 --new 4 --rounds 1 --eager   # smoke
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench.lib.common import OUT, REPO

SHAPES = ("moe-8x1k", "moe-8x1k-dense-active", "moe-8x1k-dense-total")


def child(shape: str, batch: int, new: int, rounds: int, eager: bool, overrides: list[str]) -> dict[str, Any]:
    from rillet.core.config import config_from_dict
    from rillet.core.llm import LLM
    from rillet.core.sampling_params import SamplingParams

    from bench.lib.common import peak_rss_mib

    cfg = config_from_dict(
        {
            "model": {"kind": "shape", "shape": shape, "device": "cpu", "dtype": "float32"},
            "cache": {"num_blocks": 64 + batch * (new // 16 + 4)},
            "scheduler": {"max_num_seqs": max(batch, 1)},
            "graphs": {"enabled": "off" if eager else "on"},
        },
        overrides,
    )
    prompts = [[(13 * i + k) % 1000 + 10 for k in range(16)] for i in range(batch)]
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    with LLM(cfg) as llm:
        gr = llm.engine.core.runner.graph_runner  # type: ignore[attr-defined]
        if gr is not None and gr.compiled is not None:
            gr.compiled.wait()
        llm.generate(prompts, params)  # warm-up
        t0 = time.perf_counter()
        tokens = sum(
            len(o.outputs[0].token_ids) for _ in range(rounds) for o in llm.generate(prompts, params)
        )
        elapsed = time.perf_counter() - t0
        compiled = gr is not None and gr.compiled is not None and gr.compiled.ready
    return {
        "shape": shape,
        "batch": batch,
        "decode": "compiled" if compiled else "eager",
        "tok_s": tokens / elapsed,
        "ms_per_step": elapsed * 1e3 / (rounds * new),
        "peak_rss_mib": peak_rss_mib(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--new", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="no compiled decode step")
    ap.add_argument("--set", action="append", default=[], help="rillet config override")
    ap.add_argument("--out", default=str(OUT / "moe_dispatch.json"))
    ap.add_argument("--child", nargs=2, metavar=("SHAPE", "BATCH"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        r = child(a.child[0], int(a.child[1]), a.new, a.rounds, a.eager, a.set)
        print(json.dumps(r))
        return
    from bench.lib.common import table, write_json

    rows = []
    for batch in a.batches:
        for shape in SHAPES:
            cmd = [sys.executable, "-m", "bench.engine.moe_dispatch", "--child", shape, str(batch)]
            cmd += [f"--new={a.new}", f"--rounds={a.rounds}", *(["--eager"] if a.eager else [])]
            cmd += [f"--set={s}" for s in a.set]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
        active = next(r["tok_s"] for r in rows[-3:] if r["shape"].endswith("dense-active"))
        for r in rows[-3:]:
            r["vs_dense_active"] = r["tok_s"] / active
    write_json(a.out, {"overrides": a.set, "new": a.new, "rounds": a.rounds, "rows": rows})
    print(
        table(rows, ["shape", "batch", "decode", "tok_s", "vs_dense_active", "ms_per_step", "peak_rss_mib"])
    )


if __name__ == "__main__":
    main()
