"""Image requests: rillet's engine vs transformers `generate` on a tiny-but-not-toy Gemma 3
vision-language model (random weights: an 8-layer 512-wide text model, five sliding layers of 512
positions then a global one, under an 8-layer 384-wide SigLIP tower; 224x224 images of 16x16
patches pooled to 64 image tokens), saved by transformers and read from that folder by both.
Single-image chat requests, each its own 280x280 image (no prefix-cache or encoder-cache hit),
1 and 16 at once; as bench.vision.qwen_vl measures them:

- TTFT: requests of one token, sent together; rillet: each request's first token as the offline
  API receives it (mean over the requests), transformers: the batch's `generate`;
- images/s: requests of `--tokens` tokens (greedy, EOS ignored), requests over the wall time.

Each side in its own process (peak RSS is that process's), fp32 both; rillet's decode step is the
compiled one (the default), waited for. Prints a table last, writes bench/out/vision_gemma3.json.

    flock /work/cpu.lock .venv/bin/python -m bench.vision.gemma3 [--tokens 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from bench.lib.common import decode_path, peak_rss_mib, table, use_test_support, write_json

TEXT = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "query_pre_attn_scalar": 64,
    "sliding_window": 512,
    "max_position_embeddings": 4096,
    "eos_token_id": None,
}
VISION = {
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 6,
    "image_size": 224,
    "patch_size": 14,
    "vision_use_head": False,
}
MM_TOKENS = 64
SIDE = 280
PROMPT = [{"type": "image"}, {"type": "text", "text": "Describe this picture in detail."}]


def make_folder(folder: Path) -> None:
    use_test_support()
    from tiny_models import gemma3_vlm

    gemma3_vlm.build_gemma3_vlm(
        folder, text=TEXT, vision=VISION, mm_tokens=MM_TOKENS, image_size=VISION["image_size"]
    )


def images(seed: int, n: int) -> list[Any]:
    use_test_support()
    from tiny_models.qwen_vl import png

    return [png(seed * 1000 + i, SIDE, SIDE) for i in range(n)]


def prompt_text(folder: Path) -> str:
    import transformers

    proc = transformers.AutoProcessor.from_pretrained(folder)
    msgs = [{"role": "user", "content": PROMPT}]
    return str(proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))


def run_rillet(folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
    from rillet.core.engine.inbox import NewRequest
    from rillet.core.llm import LLM
    from rillet.core.outputs import SeqDelta
    from rillet.core.sampling_params import SamplingParams

    with LLM(overrides=[f"model.path={folder}", "cache.num_blocks=272"]) as llm:
        vision = llm.engine.vision
        assert vision is not None
        decode_path(llm)  # the compiled decode step, once its background compile is done
        _compiles_done(llm)
        ids = llm.tokenizer.encode(prompt_text(folder), add_special_tokens=False)

        def batch(seed: int, max_tokens: int) -> tuple[float, list[float]]:
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            reqs = []
            for img in images(seed, conc):
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
    """The batch-1 graph compiles after the general one on the same thread (as bench.vision.qwen_vl
    waits for it): it would share the cores with the measured prefills."""
    compiled = getattr(llm.engine.core.runner.graph_runner, "compiled", None)
    thread = getattr(compiled, "_thread", None)
    if thread is not None:
        thread.join(timeout=900)


def run_hf(folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
    import transformers

    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    proc = transformers.AutoProcessor.from_pretrained(folder)
    text = prompt_text(folder)

    def batch(seed: int, max_tokens: int) -> float:
        t0 = time.perf_counter()
        pics = [[i.image] for i in images(seed, conc)]
        enc = proc(text=[text] * conc, images=pics, return_tensors="pt")  # one length: no padding
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
        return time.perf_counter() - t0

    batch(1, 1)
    ttft = statistics.median(batch(10 + r, 1) for r in range(rounds))
    wall = statistics.median(batch(20 + r, tokens) for r in range(rounds))
    return {"ttft_ms": ttft * 1000, "images_s": conc / wall}


def child(a: argparse.Namespace) -> None:
    run = run_rillet if a.only == "rillet" else run_hf
    rows = {str(c): run(Path(a.folder), c, a.tokens, a.rounds) for c in a.conc}
    print(json.dumps({"rows": rows, "peak_rss_mib": peak_rss_mib()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--out", default="bench/out/vision_gemma3.json")
    ap.add_argument("--only", choices=["rillet", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.only:
        child(a)
        return
    with tempfile.TemporaryDirectory() as tmp:
        make_folder(Path(tmp))
        side: dict[str, Any] = {}
        for who in ("rillet", "hf"):
            cmd = [sys.executable, "-m", "bench.vision.gemma3", "--only", who, "--folder", tmp]
            cmd += ["--tokens", str(a.tokens), "--rounds", str(a.rounds), "--conc", *map(str, a.conc)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            side[who] = json.loads(out.strip().splitlines()[-1])
    rows = []
    for c in a.conc:
        r, h = side["rillet"]["rows"][str(c)], side["hf"]["rows"][str(c)]
        rows.append(
            {
                "concurrent": c,
                "rillet_ttft_ms": r["ttft_ms"],
                "hf_ttft_ms": h["ttft_ms"],
                "rillet_images_s": r["images_s"],
                "hf_images_s": h["images_s"],
                "speedup": r["images_s"] / h["images_s"],
                "rillet_rss_mib": side["rillet"]["peak_rss_mib"],
                "hf_rss_mib": side["hf"]["peak_rss_mib"],
            }
        )
    write_json(a.out, {"tokens": a.tokens, "rounds": a.rounds, "side": SIDE, "rows": rows})
    print(table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
