"""A tiny random Gemma 3 vision-language model saved by transformers (`save_pretrained`) with a
tiny Gemma-like tokenizer, its chat template and a Pillow image processor: the offline stand-in
for a google/gemma-3-*-it folder.

The tokenizer is character-level BPE over printable ASCII with Gemma's special tokens at the ids
the config names, and merges for runs of 2 to 4 newlines (Gemma's vocabulary holds such runs as
one token: the processor's "\\n\\n" around an image joins the newlines beside it). The tower sees
32x32 images as a 4x4 grid of 8-pixel patches, pooled to 2x2 = 4 image tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tiny_models.hf_folders import perturb_vectors

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
NEWLINES = ["\n" * n for n in range(1, 5)]
CHARS = [chr(c) for c in range(32, 127)]
BOI, EOI, IMAGE = 112, 113, 114  # <start_of_image>, <end_of_image>, <image_soft_token>
VOCAB = 128
IMAGE_SIZE, PATCH, MM_TOKENS = 32, 8, 4

# Gemma 3's template, trimmed: system text folded into the first user turn, `model` for the
# assistant, an image part as <start_of_image>
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<start_of_image>"
    "{% elif p['type'] == 'text' %}{{ p['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,  # five sliding layers, then a global one
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "sliding_window": 8,  # shorter than an image's block with its neighbours: the window bites
    "query_pre_attn_scalar": 16,
    "initializer_range": 0.1,
    "bos_token_id": 2,
    "eos_token_id": None,
    "pad_token_id": 0,
}
VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH,
    "vision_use_head": False,
}


def tokenizer_backend() -> Any:
    from tokenizers import Tokenizer, decoders, models

    words = SPECIALS + NEWLINES + CHARS
    words += [f"<unused{i}>" for i in range(BOI - len(words))]
    words += ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    vocab = {t: i for i, t in enumerate(words)}
    merges = [("\n", "\n"), ("\n\n", "\n"), ("\n\n", "\n\n")]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([*SPECIALS, "<start_of_image>", "<end_of_image>", "<image_soft_token>"])
    return tok


def build_gemma3_vlm(
    folder: Path,
    seed: int = 0,
    text: dict[str, Any] | None = None,
    vision: dict[str, Any] | None = None,
    mm_tokens: int = MM_TOKENS,
    image_size: int = IMAGE_SIZE,
) -> Any:
    """Save the model, tokenizer and processor under `folder`; -> the fp32 HF model in eval.
    `text` / `vision`: config keys over TEXT_CONFIG / VISION_CONFIG (a larger model: benchmarks)."""
    import transformers
    from transformers.models.gemma3 import Gemma3ImageProcessorPil

    backend = tokenizer_backend()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    assert fast.convert_tokens_to_ids(["<start_of_image>", "<end_of_image>", "<image_soft_token>"]) == [
        BOI,
        EOI,
        IMAGE,
    ], "the special image tokens must take the ids the config names"
    cfg = transformers.Gemma3Config(
        text_config={**TEXT_CONFIG, **(text or {})},
        vision_config={**VISION_CONFIG, **(vision or {})},
        mm_tokens_per_image=mm_tokens,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        image_token_index=IMAGE,
    )
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    perturb_vectors(model)
    with torch.no_grad():  # projector init is all zeros: images would vanish
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    image_proc = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
    proc = transformers.Gemma3Processor(
        image_processor=image_proc, tokenizer=fast, chat_template=CHAT_TEMPLATE, image_seq_length=mm_tokens
    )
    proc.save_pretrained(folder)
    return model
