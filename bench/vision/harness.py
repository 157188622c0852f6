"""What the image benchmarks share (bench.vision.qwen_vl, bench.vision.gemma3): the requests'
images, rillet's side (engine requests through the offline API, the compiled decode step waited
for), the medians of transformers' side, and the driver that runs each side in its own process
(peak RSS is that process's) and prints the table last."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.common import decode_path, peak_rss_mib, table, use_test_support, write_json

Side = Callable[[Path, int, int, int], dict[str, float]]  # (folder, concurrent, tokens, rounds)


@dataclass(frozen=True)
class Family:
    module: str  # the benchmark's module, run again as each side's process
    side: int  # images are side x side
    make_folder: Callable[[Path], None]
    prompt_ids: Callable[[Path, Any], list[int]]  # (folder, the LLM): one image's chat prompt
    run_hf: Side


def images(seed: int, n: int, side: int) -> list[Any]:
    """`n` distinct images (no prefix-cache or encoder-cache hit between them)."""
    use_test_support()
    from tiny_models.qwen_vl import png

    return [png(seed * 1000 + i, side, side) for i in range(n)]


def run_rillet(fam: Family, folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
    from rillet.core.engine.inbox import NewRequest
    from rillet.core.llm import LLM
    from rillet.core.outputs import SeqDelta
    from rillet.core.sampling_params import SamplingParams

    with LLM(overrides=[f"model.path={folder}", "cache.num_blocks=272"]) as llm:
        vision = llm.engine.vision
        assert vision is not None
        decode_path(llm)  # the compiled decode step, once its background compile is done
        _compiles_done(llm)
        ids = fam.prompt_ids(folder, llm)

        def batch(seed: int, max_tokens: int) -> tuple[float, list[float]]:
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            reqs = []
            for img in images(seed, conc, fam.side):
                mp = vision.expand(ids, [img])
                reqs.append(NewRequest(uuid.uuid4().hex, mp.prompt_ids, params, mm=mp.mm))
            first: dict[str, float] = {}

            def take(d: SeqDelta) -> int:
                first.setdefault(d.request_id, time.perf_counter())
                return int(d.finish_reason is not None)

            t0 = time.perf_counter()
            llm.engine.add_requests(reqs)
            llm._drain(take, len(reqs))
            return time.perf_counter() - t0, [t - t0 for t in first.values()]

        batch(1, 1)  # warm-up
        ttft = statistics.median(statistics.mean(batch(10 + r, 1)[1]) for r in range(rounds))
        wall = statistics.median(batch(20 + r, tokens)[0] for r in range(rounds))
    return {"ttft_ms": ttft * 1000, "images_s": conc / wall}


def _compiles_done(llm: Any) -> None:
    """decode_path returns once the general graph serves; the batch-1 graph compiles after it on
    the same thread, which would share the 2 cores with the measured prefills (seconds slower)."""
    compiled = getattr(llm.engine.core.runner.graph_runner, "compiled", None)
    thread = getattr(compiled, "_thread", None)
    if thread is not None:
        thread.join(timeout=900)


def hf_medians(batch: Callable[[int, int], float], conc: int, tokens: int, rounds: int) -> dict[str, float]:
    """transformers' side: `batch(seed, max_tokens)` times one `generate` over `conc` requests
    (every row's first token comes at once)."""
    batch(1, 1)  # warm-up
    ttft = statistics.median(batch(10 + r, 1) for r in range(rounds))
    wall = statistics.median(batch(20 + r, tokens) for r in range(rounds))
    return {"ttft_ms": ttft * 1000, "images_s": conc / wall}


def main(fam: Family, doc: str | None, out: str) -> None:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--out", default=out)
    ap.add_argument("--only", choices=["rillet", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.only:
        _child(fam, a)
        return
    with tempfile.TemporaryDirectory() as tmp:
        fam.make_folder(Path(tmp))
        side: dict[str, Any] = {}
        for who in ("rillet", "hf"):
            cmd = [sys.executable, "-m", fam.module, "--only", who, "--folder", tmp]
            cmd += ["--tokens", str(a.tokens), "--rounds", str(a.rounds), "--conc", *map(str, a.conc)]
            stdout = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            side[who] = json.loads(stdout.strip().splitlines()[-1])
    rows = [_row(c, side) for c in a.conc]
    write_json(a.out, {"tokens": a.tokens, "rounds": a.rounds, "side": fam.side, "rows": rows})
    print(table(rows, list(rows[0])))


def _child(fam: Family, a: argparse.Namespace) -> None:
    def rillet(folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
        return run_rillet(fam, folder, conc, tokens, rounds)

    run = rillet if a.only == "rillet" else fam.run_hf
    rows = {str(c): run(Path(a.folder), c, a.tokens, a.rounds) for c in a.conc}
    print(json.dumps({"rows": rows, "peak_rss_mib": peak_rss_mib()}))


def _row(c: int, side: dict[str, Any]) -> dict[str, Any]:
    r, h = side["rillet"]["rows"][str(c)], side["hf"]["rows"][str(c)]
    return {
        "concurrent": c,
        "rillet_ttft_ms": r["ttft_ms"],
        "hf_ttft_ms": h["ttft_ms"],
        "rillet_images_s": r["images_s"],
        "hf_images_s": h["images_s"],
        "speedup": r["images_s"] / h["images_s"],
        "rillet_rss_mib": side["rillet"]["peak_rss_mib"],
        "hf_rss_mib": side["hf"]["peak_rss_mib"],
    }
