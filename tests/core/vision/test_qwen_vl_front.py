"""Qwen2-VL's front end against transformers: the patches of Qwen2VLImageProcessorPil (dynamic
resolution within the folder's min/max pixels) and the M-RoPE positions of `get_rope_index`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rillet.core.vision.image import ImageError, ImageErrorKind
from rillet.core.vision.qwen2_vl.front import QwenVLFront
from rillet.core.vision.qwen2_vl.pixels import Preprocessor
from tiny_models.qwen_vl import IMAGE_TOKEN_ID, chat_ids, make_qwen_vl, png


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    folder = tmp_path_factory.mktemp("qwen2_vl")
    model, processor = make_qwen_vl(folder)
    return folder, model, processor


# (height, width): in bounds, past max_pixels (scaled down), under min_pixels (scaled up), tall
SIZES = [(40, 60), (300, 200), (20, 20), (90, 31)]


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_patches_match_transformers(qwen: tuple[Path, Any, Any], height: int, width: int) -> None:
    folder, _, processor = qwen
    image = png(height + width, height, width)
    want = processor(images=[image.image], return_tensors="np")
    pixels, grid = Preprocessor.from_folder(folder).patches(image.image)
    assert list(grid) == want["image_grid_thw"][0].tolist()
    # within one 8-bit level, in normalized units (the largest 1 / (255 * std))
    level = 1 / (255 * min(processor.image_std))
    np.testing.assert_allclose(pixels, want["pixel_values"], rtol=0, atol=level)


def test_expand_matches_transformers_positions(qwen: tuple[Path, Any, Any]) -> None:
    folder, model, processor = qwen
    images = [png(1, 40, 60), png(2, 70, 30)]
    ids = chat_ids(2, "Compare them.")
    front = QwenVLFront(Preprocessor.from_folder(folder), IMAGE_TOKEN_ID)
    mp = front.expand(ids, images)
    out = processor(images=[i.image for i in images], return_tensors="pt")
    x = torch.tensor([mp.prompt_ids])
    pos, delta = model.model.get_rope_index(
        x, mm_token_type_ids=(x == IMAGE_TOKEN_ID).int(), image_grid_thw=out["image_grid_thw"]
    )
    assert mp.image_tokens == int(out["image_grid_thw"].prod(-1).sum()) // 4
    assert mp.mm is not None
    np.testing.assert_array_equal(mp.mm.positions, pos[:, 0].numpy())
    assert mp.mm.rope_delta == int(delta)
    assert [it.content_hash for it in mp.mm.items] == [i.content_hash for i in images]


def test_placeholder_count_must_match(qwen: tuple[Path, Any, Any]) -> None:
    folder, _, _ = qwen
    front = QwenVLFront(Preprocessor.from_folder(folder), IMAGE_TOKEN_ID, max_images=2)
    with pytest.raises(ImageError) as e:
        front.expand(chat_ids(1, "hi"), [png(1, 40, 60), png(2, 40, 60)])
    assert e.value.part == "image1"
    with pytest.raises(ImageError) as e:
        front.expand(chat_ids(3, "hi"), [png(i, 40, 60) for i in range(3)])
    assert e.value.kind is ImageErrorKind.TOO_MANY_IMAGES
    assert front.expand(chat_ids(0, "hi"), []).mm is None


def test_released_flat_config_reads_as_the_nested_one(qwen: tuple[Path, Any, Any]) -> None:
    """Qwen's released config.json is flat with rope_scaling {"type": "mrope"}; transformers 5
    saves a nested text_config whose rope_parameters hold the section: the same text model."""
    import json

    from rillet.core.model.families import arch_from_hf_config

    nested = json.loads((qwen[0] / "config.json").read_text())
    text = {k: v for k, v in nested["text_config"].items() if k != "rope_parameters"}
    flat = {**nested, **text, "rope_theta": 10000.0, "model_type": "qwen2_vl"}
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": [2, 3, 3]}
    del flat["text_config"]
    a, b = arch_from_hf_config(nested), arch_from_hf_config(flat)
    assert a == b
    assert a.mrope_section == (2, 3, 3) and a.rope_scaling is None and a.attention_bias


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("parallel.tensor_parallel_size=2", "parallel.tensor_parallel_size"),
        ("speculative.method=ngram", "speculative.method"),
    ],
)
def test_unsupported_setups_refused(qwen: tuple[Path, Any, Any], override: str, key: str) -> None:
    """Before any rank starts or weight loads: a ConfigError naming the key."""
    from rillet.core.config import ConfigError, load_config
    from rillet.core.runtime import load_runtime

    cfg = load_config(None, [f"model.path={qwen[0]}", override])
    with pytest.raises(ConfigError) as e:
        load_runtime(cfg)
    assert e.value.key == key
