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


def prompt_ids(folder: Path, llm: Any) -> list[int]:
    use_test_support()
    from tiny_models.qwen_vl import chat_ids

    return chat_ids(1, "Describe this picture in detail.")


def run_hf(folder: Path, conc: int, tokens: int, rounds: int) -> dict[str, float]:
    import transformers

    use_test_support()
    from tiny_models.qwen_vl import IMAGE_TOKEN_ID, chat_ids

    model = transformers.Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    proc = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    ids = chat_ids(1, "Describe this picture in detail.")

    def batch(seed: int, max_tokens: int) -> float:
        t0 = time.perf_counter()
        out = proc(images=[i.image for i in images(seed, conc, SIDE)], return_tensors="pt")
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

    return hf_medians(batch, conc, tokens, rounds)


FAMILY = Family("bench.vision.qwen_vl", SIDE, make_folder, prompt_ids, run_hf)

if __name__ == "__main__":
    main(FAMILY, __doc__, "bench/out/vision_qwen_vl.json")
