"""Offline generation throughput: rillet's engine vs Hugging Face transformers `generate`.

Same model file (the default SmolLM2-135M Q4_1 GGUF), same prompts, same machine, greedy, a fixed
number of new tokens (EOS ignored). Batch 1 and a batch of 16. transformers always runs fp32 (it
dequantizes the GGUF); rillet runs its default (`model.quantization: auto`: int4 weights with
bf16 activations for this 4-bit file on CPU) unless told otherwise. Prints a table last, writes JSON.

    .venv/bin/python bench/offline_throughput.py [--tokens 64] [--batch 1 16] [--set model.quantization=none]

The decode step is compiled on CPU by default (`graphs.enabled: auto`); the script waits for the
background compile before it measures. `--set graphs.enabled=off` measures the eager step.
"""

from __future__ import annotations

import argparse
import time

import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.loaders.default_model import default_model_path
from rillet.core.sampling_params import SamplingParams

from bench.lib.common import decode_path, peak_rss_mib, table, write_json

PROMPTS = [f"Write a short story number {i} about a robot who learns to paint." for i in range(64)]


def bench_rillet(batch: int, tokens: int, overrides: list[str]) -> tuple[float, str, str]:
    """(tok/s, the weights as run: "int4" or the activation dtype, the decode path)."""
    cfg = config_from_dict({"model": {"device": "cpu"}, "cache": {"num_blocks": 1024}}, overrides)
    with LLM(cfg) as llm:
        rt = llm.engine.runtime
        weights = "int4" if rt.quantization == "int4" else str(rt.dtype).removeprefix("torch.")
        path = decode_path(llm)
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        llm.generate(PROMPTS[:batch], params)  # warm-up
        t0 = time.perf_counter()
        outs = llm.generate(PROMPTS[batch : 2 * batch], params)
        dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return n / dt, weights, path


def bench_hf(batch: int, tokens: int) -> float:
    import transformers

    path = default_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.padding_side = "left"
    tok.pad_token = tok.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()

    def run(prompts: list[str]) -> int:
        enc = tok(prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(
                **enc,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        return (out.shape[1] - enc.input_ids.shape[1]) * len(prompts)

    run(PROMPTS[:batch])
    t0 = time.perf_counter()
    n = run(PROMPTS[batch : 2 * batch])
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument(
        "--set", action="append", default=[], help="rillet config override, e.g. model.quantization=int4"
    )
    ap.add_argument("--out", default="bench/out/offline_throughput.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for b in a.batch:
        r, weights, path = bench_rillet(b, a.tokens, a.set)
        h = None if a.skip_hf else bench_hf(b, a.tokens)
        row = {"batch": b, "rillet_weights": weights, "decode": path, "rillet_tok_s": r, "hf_fp32_tok_s": h}
        rows.append({**row, "speedup": (r / h) if h else None})
    rss = peak_rss_mib()
    for row in rows:
        row["peak_rss_mib"] = rss
    write_json(a.out, {"tokens": a.tokens, "threads": a.threads, "overrides": a.set, "rows": rows})
    cols = ["batch", "rillet_weights", "decode", "rillet_tok_s", "hf_fp32_tok_s", "speedup", "peak_rss_mib"]
    print(table(rows, cols))


if __name__ == "__main__":
    main()
