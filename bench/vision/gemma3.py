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

import time
from pathlib import Path
from typing import Any

import torch

from bench.lib.common import use_test_support
from bench.vision.harness import Family, hf_medians, images, main

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


def prompt_text(folder: Path) -> str:
    import transformers

    proc = transformers.AutoProcessor.from_pretrained(folder)
    msgs = [{"role": "user", "content": PROMPT}]
    return str(proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))


def prompt_ids(folder: Path, llm: Any) -> list[int]:
    return list(llm.tokenizer.encode(prompt_text(folder), add_special_tokens=False))


def run_hf(folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
    import transformers

    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    proc = transformers.AutoProcessor.from_pretrained(folder)
    text = prompt_text(folder)

    def batch(seed: int, max_tokens: int) -> float:
        t0 = time.perf_counter()
        pics = [[i.image] for i in images(seed, conc, SIDE)]
        enc = proc(text=[text] * conc, images=pics, return_tensors="pt")  # one length: no padding
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
        return time.perf_counter() - t0

    return hf_medians(batch, conc, tokens, rounds)


FAMILY = Family("bench.vision.gemma3", SIDE, make_folder, prompt_ids, run_hf)

if __name__ == "__main__":
    main(FAMILY, __doc__, "bench/out/vision_gemma3.json")
