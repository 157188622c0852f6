"""A Gemma 3 vision-language model through the whole engine against transformers' generate, greedy,
float32, token for token, with the first step's logprobs: one image, two images of different sizes,
text only, an image request batched with a text one, a step budget that would cut an image (the
chunk stops before it: its tokens attend to each other bidirectionally), a prefix-cache hit on the
same image and a miss on a different image of the same size.

The tiny model (tiny_models/gemma3_vlm.py) has sliding windows of 8 over prompts of ~40 tokens and
4-token images: the windows, the bidirectional blocks and the unscaled image embeddings all decide
its tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from rillet.core.config import ConfigError, config_from_dict
from rillet.core.llm import LLM, RequestOutput
from rillet.core.sampling_params import SamplingParams
from rillet.core.tokenizer.tokenizer import Tokenizer
from rillet.core.vision.image import ImageInput

NEW = 8
BUDGET = 10  # tokens a step: the first image (offset 8) would be cut at 10, so the chunk stops at 8
PARAMS = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True, logprobs=3)


def _image(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


RED, BLUE = _image(40, 24, 1), _image(40, 24, 2)  # one size: the same placeholder ids
TALL = _image(12, 50, 3)


MULTI_TURN: list[dict[str, Any]] = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Noise."}]},
    {"role": "user", "content": [{"type": "text", "text": "And this"}, {"type": "image"}]},
]


@pytest.fixture(scope="module")
def served(tiny_gemma3_vlm: tuple[Path, Any]) -> Iterator[tuple[LLM, Any, Tokenizer]]:
    import transformers

    folder, _ = tiny_gemma3_vlm
    cfg = {
        "model": {"path": str(folder), "kind": "hf", "dtype": "float32"},
        "scheduler": {"max_num_batched_tokens": BUDGET, "max_num_seqs": 4},
        "cache": {"block_size": 8},
    }
    with LLM(config_from_dict(cfg)) as llm:
        yield llm, transformers.AutoProcessor.from_pretrained(folder), Tokenizer.from_hf_folder(folder)


def _text(proc: Any, content: list[dict[str, Any]]) -> str:
    """A user turn's parts, or (entries with a role) a whole conversation."""
    msgs = content if content and "role" in content[0] else [{"role": "user", "content": content}]
    return str(proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))


def _hf(model: Any, proc: Any, text: str, images: list[Image.Image]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and its first step's log-softmax."""
    enc = proc(text=text, images=images or None, return_tensors="pt")
    with torch.inference_mode():
        g = model.generate(
            **enc,
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return g.sequences[0, enc["input_ids"].shape[1] :].tolist(), g.logits[0][0].log_softmax(-1)


def _check(out: RequestOutput, want: tuple[list[int], torch.Tensor]) -> None:
    tokens, first = want
    got = out.outputs[0]
    assert got.token_ids == tokens
    assert got.logprobs is not None
    lp = got.logprobs[0]
    tol = 1000 * torch.finfo(torch.float32).eps  # float32 logits, two implementations of one model
    assert lp.logprob == pytest.approx(first[lp.token_id].item(), abs=tol)
    for tid, val in lp.top:
        assert val == pytest.approx(first[tid].item(), abs=tol)


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)  # the template writes <bos> itself


def _inputs(images: list[Image.Image], first: int = 0) -> list[ImageInput]:
    import hashlib

    return [
        ImageInput(im, f"messages[0].content[{first + i}]", hashlib.sha256(im.tobytes()).digest())
        for i, im in enumerate(images)
    ]


def test_one_image_two_images_and_text_batched(
    served: tuple[LLM, Any, Tokenizer], tiny_gemma3_vlm: tuple[Path, Any]
) -> None:
    llm, proc, tok = served
    _, model = tiny_gemma3_vlm
    cases = [
        ([{"type": "image"}, {"type": "text", "text": "What is in the picture?"}], [RED]),
        (
            [
                {"type": "text", "text": "Compare"},
                {"type": "image"},
                {"type": "text", "text": "and"},
                {"type": "image"},
            ],
            [TALL, BLUE],
        ),
        ([{"type": "text", "text": "No picture here, only words to read."}], []),
        (MULTI_TURN, [BLUE, TALL]),
    ]
    texts = [_text(proc, c) for c, _ in cases]
    want = [_hf(model, proc, t, ims) for t, (_, ims) in zip(texts, cases, strict=True)]
    outs = llm.generate([_ids(tok, t) for t in texts], PARAMS, images=[_inputs(ims) for _, ims in cases])
    for out, w in zip(outs, want, strict=True):
        _check(out, w)
    assert len(outs[0].prompt_ids) == len(proc(text=texts[0], images=[RED])["input_ids"][0])


def test_prefix_cache_hits_the_same_image_and_misses_another_of_its_size(
    served: tuple[LLM, Any, Tokenizer], tiny_gemma3_vlm: tuple[Path, Any]
) -> None:
    llm, proc, tok = served
    _, model = tiny_gemma3_vlm
    content = [
        {"type": "text", "text": "Look:"},
        {"type": "image"},
        {"type": "text", "text": "tell me about it now"},
    ]
    text = _text(proc, content)
    first = llm.generate([_ids(tok, text)], PARAMS, images=[_inputs([RED])])[0]
    same = llm.generate([_ids(tok, text)], PARAMS, images=[_inputs([RED])])[0]
    other = llm.generate([_ids(tok, text)], PARAMS, images=[_inputs([BLUE])])[0]
    _check(first, _hf(model, proc, text, [RED]))
    _check(same, _hf(model, proc, text, [RED]))
    _check(other, _hf(model, proc, text, [BLUE]))
    image_at = same.prompt_ids.index(112) + 1
    assert same.outputs[0].cached_tokens > image_at + 4, "the same image: cached past it"
    assert other.outputs[0].cached_tokens <= image_at, "a different image: no hit from its first token on"


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"scheduler": {"max_num_batched_tokens": 3, "max_num_seqs": 2}}, "scheduler.max_num_batched_tokens"),
        ({"engine": {"deterministic": "on"}}, "engine.deterministic"),
    ],
    ids=["budget-under-an-image", "deterministic"],
)
def test_what_cannot_keep_an_image_bidirectional_is_refused(
    tiny_gemma3_vlm: tuple[Path, Any], section: dict[str, Any], key: str
) -> None:
    """A step budget smaller than an image (its block never fits a chunk) and the batch-invariant
    backend (no image blocks) are refused at start, naming the key."""
    folder, _ = tiny_gemma3_vlm
    cfg = {"model": {"path": str(folder), "kind": "hf", "dtype": "float32"}, **section}
    with pytest.raises(ConfigError) as e:
        LLM(config_from_dict(cfg))
    assert e.value.key == key
