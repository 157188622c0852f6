"""Image requests: rillet's engine vs transformers `generate` on the same tiny-but-not-toy Qwen2-VL
(random weights, ~45M parameters: an 8-layer 512-wide text model under an 8-block 384-wide
tower), saved by transformers and read from that folder by both. Single-image chat requests, each
its own image (280x280: 100 image tokens; no prefix-cache or encoder-cache hit), 1 and 16 at once.

- TTFT: requests of one token, sent together; rillet: each request's first token as the offline
  API receives it (mean over the requests), transformers: the batch's `generate` (every row's
  first token comes at once);
- images/s: requests of `--tokens` tokens (greedy, EOS ignored), requests over the wall time.

Each side runs in its own process (peak RSS is that process's), fp32 both (rillet's default for an
fp32 folder on CPU); rillet's decode step is the compiled one (the default), waited for.
Prints a table last, writes bench/out/vision_qwen_vl.json.

    flock /work/cpu.lock .venv/bin/python -m bench.vision.qwen_vl [--tokens 16] [--rounds 3]
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
    "vocab_size": 300,
    "max_position_embeddings": 4096,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 10000.0},
}
VISION = {"depth": 8, "embed_dim": 384, "hidden_size": 512, "num_heads": 6, "mlp_ratio": 4, "in_chans": 3}
SIDE = 280


def make_folder(folder: Path) -> None:
    import transformers

    use_test_support()
    from tiny_models import qwen_vl

    torch.manual_seed(0)
    ids = {"image_token_id": qwen_vl.IMAGE_TOKEN_ID, "vision_start_token_id": 259, "vision_end_token_id": 260}
    config = transformers.Qwen2VLConfig(text_config=TEXT, vision_config=VISION, video_token_id=262, **ids)
    transformers.Qwen2VLForConditionalGeneration(config).save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 256).save_pretrained(
        folder
    )
    tok = qwen_vl.tokenizer()
    tok.chat_template = qwen_vl.CHAT_TEMPLATE
    tok.save_pretrained(folder)


def images(seed: int, n: int) -> list[Any]:
    use_test_support()
    from tiny_models.qwen_vl import png

    return [png(seed * 1000 + i, SIDE, SIDE) for i in range(n)]


def run_rillet(folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
    use_test_support()
    from rillet.core.engine.inbox import NewRequest
    from rillet.core.llm import LLM
    from rillet.core.outputs import SeqDelta
    from rillet.core.sampling_params import SamplingParams
    from tiny_models.qwen_vl import chat_ids

    ids = chat_ids(1, "Describe this picture in detail.")
    with LLM(overrides=[f"model.path={folder}", "cache.num_blocks=272"]) as llm:
        vision = llm.engine.vision
        assert vision is not None
        decode_path(llm)  # the compiled decode step, once its background compile is done
        _compiles_done(llm)

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
    """decode_path returns once the general graph serves; the batch-1 graph compiles after it on
    the same thread, which would share the 2 cores with the measured prefills (seconds slower)."""
    compiled = getattr(llm.engine.core.runner.graph_runner, "compiled", None)
    thread = getattr(compiled, "_thread", None)
    if thread is not None:
        thread.join(timeout=900)


def run_hf(folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
    import transformers

    use_test_support()
    from tiny_models.qwen_vl import IMAGE_TOKEN_ID, chat_ids

    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    proc = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    ids = chat_ids(1, "Describe this picture in detail.")

    def batch(seed: int, max_tokens: int) -> float:
        t0 = time.perf_counter()
        out = proc(images=[i.image for i in images(seed, conc)], return_tensors="pt")
        n = int(out["image_grid_thw"][0].prod()) // 4  # one size: every row has the same length
        row = [t for tok in ids for t in ([tok] * n if tok == IMAGE_TOKEN_ID else [tok])]
        x = torch.tensor([row] * conc)
        with torch.inference_mode():
            model.generate(
                x,
                attention_mask=torch.ones_like(x),
                pixel_values=out["pixel_values"],
                image_grid_thw=out["image_grid_thw"],
                mm_token_type_ids=(x == IMAGE_TOKEN_ID).int(),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
            )
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
    ap.add_argument("--out", default="bench/out/vision_qwen_vl.json")
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
            cmd = [sys.executable, "-m", "bench.vision.qwen_vl", "--only", who, "--folder", tmp]
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
