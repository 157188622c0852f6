"""A tiny random Qwen2-VL (or Qwen2.5-VL) folder as transformers saves one for the hub: config with
a small vision tower, weights, a byte-level tokenizer built offline (256 byte tokens, then Qwen's
special tokens), Qwen2-VL's chat template and a Qwen2VLImageProcessorPil with small pixel bounds
(images of a few dozen pixels a side give a few dozen image tokens); plain added tokens fill the
vocabulary up to the model's 300 ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tiny_models.hf_folders import perturb_vectors

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
IMAGE_TOKEN_ID = 256 + SPECIALS.index("<|image_pad|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 1024,
    "initializer_range": 0.1,  # peaky logits: greedy argmax never hinges on a near-tie
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
}
VISION = {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 4, "mlp_ratio": 2, "in_chans": 3}
PIXELS = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 64}


def tokenizer() -> Any:
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    # plain added tokens up to the model's vocabulary: every id the random model may pick has a
    # text, so served answers can be compared with transformers' ids token by token
    tok.add_tokens([f"<|extra_{i}|>" for i in range(256 + len(SPECIALS), int(TEXT["vocab_size"]))])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def make_qwen_vl(folder: Path, family: str = "qwen2_vl", seed: int = 0) -> tuple[Any, Any]:
    """Saves the folder; -> (fp32 HF model in eval, its image processor)."""
    import transformers

    torch.manual_seed(seed)
    ids = {
        "image_token_id": IMAGE_TOKEN_ID,
        "video_token_id": 256 + SPECIALS.index("<|video_pad|>"),
        "vision_start_token_id": 256 + SPECIALS.index("<|vision_start|>"),
        "vision_end_token_id": 256 + SPECIALS.index("<|vision_end|>"),
    }
    if family == "qwen2_vl":
        config = transformers.Qwen2VLConfig(text_config=TEXT, vision_config=VISION, **ids)
        model = transformers.Qwen2VLForConditionalGeneration(config)
    else:
        vision = {
            "depth": 4,
            "hidden_size": 32,
            "out_hidden_size": 64,
            "intermediate_size": 48,
            "num_heads": 4,
            "window_size": 56,
            "fullatt_block_indexes": [1, 3],
        }
        config = transformers.Qwen2_5_VLConfig(text_config=TEXT, vision_config=vision, **ids)
        model = transformers.Qwen2_5_VLForConditionalGeneration(config)
    model = model.eval()
    perturb_vectors(model)
    model.save_pretrained(folder)
    # Qwen2VLProcessor itself needs torchvision (its video processor): the image processor and
    # the tokenizer are saved as it saves them, and tests expand the placeholders as it does
    images = transformers.Qwen2VLImageProcessorPil(**PIXELS)
    images.save_pretrained(folder)
    tok = tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return model, images


def png(seed: int, height: int, width: int, level: int | None = None) -> Any:
    """A random RGB image (`level`: one grey level instead) through decode_image (a PNG's bytes),
    as a front end hands it over."""
    import io

    import numpy as np
    from PIL import Image
    from rillet.core.vision.image import decode_image

    arr = np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8)
    if level is not None:
        arr[:] = level
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return decode_image(buf.getvalue(), f"image{seed}", 10**8)


def chat_ids(images: int, text: str, history: list[dict[str, Any]] | None = None) -> list[int]:
    """The chat template's prompt for a user turn of `images` image entries, then `text`, after
    the turns of `history`."""
    tok = tokenizer()
    content = [{"type": "image"}] * images + [{"type": "text", "text": text}]
    msgs = [*(history or []), {"role": "user", "content": content}]
    rendered = tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False, chat_template=CHAT_TEMPLATE
    )
    return list(tok(rendered)["input_ids"])


def hf_generate(
    model: Any, processor: Any, ids: list[int], images: list[Any], max_new: int
) -> tuple[list[int], list[int], Any]:
    """transformers' greedy answer: (expanded prompt, new tokens, first step's logprobs [V])."""
    kw: dict[str, Any] = {}
    expanded = list(ids)
    if images:
        out = processor(images=[i.image for i in images], return_tensors="pt")
        runs = iter(int(g.prod()) // 4 for g in out["image_grid_thw"])
        expanded = [t for tok in ids for t in ([tok] * next(runs) if tok == IMAGE_TOKEN_ID else [tok])]
        kw = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    x = torch.tensor([expanded])
    kw["mm_token_type_ids"] = (x == IMAGE_TOKEN_ID).int()
    with torch.no_grad():
        g = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            **kw,
        )
    return expanded, g.sequences[0, len(expanded) :].tolist(), torch.log_softmax(g.scores[0][0].float(), -1)
