"""Gemma 3's image side against transformers on a tiny random model saved by save_pretrained
(tiny_models/gemma3_vlm.py): the tower + projector against `Gemma3Model.get_image_features`, the
pixels against Gemma3ImageProcessorPil, the placeholder expansion against Gemma3Processor's ids,
and the checkpoint layouts and configs the loader reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from rillet.core.config import ConfigError
from rillet.core.loaders.hf import iter_safetensors
from rillet.core.vision.gemma3.config import preprocess_spec, vision_arch
from rillet.core.vision.gemma3.setup import load_gemma3_vision
from rillet.core.vision.image import ImageError, ImageInput
from rillet.core.vision.payload import MmItem


def _image(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def _input(img: Image.Image, part: str = "messages[0].content[0]") -> ImageInput:
    return ImageInput(img, part, bytes([len(part)]) * 32)


@pytest.fixture(scope="module")
def hf(tiny_gemma3_vlm: tuple[Path, Any]) -> tuple[Path, Any, Any]:
    import transformers

    folder, model = tiny_gemma3_vlm
    return folder, model, transformers.AutoProcessor.from_pretrained(folder)


def _weights(folder: Path) -> list[tuple[str, torch.Tensor]]:
    files = sorted(folder.glob("*.safetensors"))
    return list(iter_safetensors(files, torch.float32))


def test_tower_matches_get_image_features(hf: tuple[Path, Any, Any]) -> None:
    folder, model, proc = hf
    _front, tower = load_gemma3_vision(folder, torch.float32)
    tower.load_weights([(n, t) for n, t in _weights(folder) if tower.claims(n)])
    images = [_image(32, 32, 0), _image(50, 20, 1), _image(17, 90, 2)]
    pixels = proc.image_processor(images, return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        want = model.model.get_image_features(pixels).pooler_output  # [3, 4, 64]
    items = [MmItem(0, 4, b"", p.numpy()) for p in pixels]
    got = torch.stack(tower.encode(items))
    assert got.shape == want.shape == (3, 4, 64)
    tol = 64 * torch.finfo(torch.float32).eps * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=tol, rtol=0)


def test_tower_loads_the_released_layout(hf: tuple[Path, Any, Any]) -> None:
    """Released checkpoints: `vision_tower.vision_model.*`; in-memory / newer: `model.` in front."""
    folder, _, _ = hf
    ws = [(n, t) for n, t in _weights(folder) if n.startswith(("vision_tower.", "multi_modal_projector."))]
    released = [(n.replace("vision_tower.", "vision_tower.vision_model.", 1), t) for n, t in ws]
    prefixed = [("model." + n, t) for n, t in ws]
    outs = []
    for layout in (ws, released, prefixed):
        _, tower = load_gemma3_vision(folder, torch.float32)
        tower.load_weights(layout)
        pixels = np.zeros((3, 32, 32), np.float32) + 0.25
        outs.append(tower.encode([MmItem(0, 4, b"", pixels)])[0])
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    _, tower = load_gemma3_vision(folder, torch.float32)
    with pytest.raises(ValueError, match="missing vision weights"):
        tower.load_weights(ws[:-1])


@pytest.mark.parametrize("size", [(32, 32), (64, 48), (13, 29), (300, 7)])
def test_pixels_match_the_pil_processor(hf: tuple[Path, Any, Any], size: tuple[int, int]) -> None:
    folder, _, proc = hf
    front, _ = load_gemma3_vision(folder, torch.float32)
    img = _image(*size, seed=size[0])
    want = proc.image_processor([img], return_tensors="np")["pixel_values"][0]
    from rillet.core.vision.gemma3.preprocess import pixel_values

    got = pixel_values(img, front.pre)
    assert got.shape == want.shape == (3, 32, 32) and got.dtype == np.float32
    level = 1 / 255 / 0.5  # one 8-bit level after normalizing by std 0.5
    assert np.abs(got - want).max() <= level


MESSAGES = [
    [{"type": "image"}, {"type": "text", "text": "Describe it."}],
    [
        {"type": "text", "text": "Two:"},
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "same?"},
    ],
    [{"type": "text", "text": "end"}, {"type": "image"}],
]


@pytest.mark.parametrize("content", MESSAGES, ids=["one", "two-adjacent", "last"])
def test_expand_matches_the_processor(hf: tuple[Path, Any, Any], content: list[dict[str, str]]) -> None:
    from rillet.core.tokenizer.tokenizer import Tokenizer

    folder, _, proc = hf
    front, _ = load_gemma3_vision(folder, torch.float32)
    msgs = [{"role": "user", "content": content}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    images = [_image(20 + 7 * i, 30, i) for i, p in enumerate(content) if p["type"] == "image"]
    want = proc(text=text, images=images, return_tensors="np")
    ids = Tokenizer.from_hf_folder(folder).encode(text, add_special_tokens=False)
    mp = front.expand(ids, [_input(im, f"part{i}") for i, im in enumerate(images)])
    assert mp.prompt_ids == want["input_ids"][0].tolist()
    assert mp.image_tokens == 4 * len(images)
    types = np.zeros(len(mp.prompt_ids), np.int64)
    for it in mp.mm.items:  # type: ignore[attr-defined]
        types[it.offset : it.end] = 1
    assert types.tolist() == want["token_type_ids"][0].tolist()
    for it, pix in zip(mp.mm.items, want["pixel_values"], strict=True):  # type: ignore[attr-defined]
        assert np.abs(it.pixels - pix).max() <= 1 / 255 / 0.5


def test_expand_refuses_a_placeholder_count_that_differs(hf: tuple[Path, Any, Any]) -> None:
    folder, _, _ = hf
    front, _ = load_gemma3_vision(folder, torch.float32)
    assert front.expand([2, 50, 51], []).mm is None
    with pytest.raises(ImageError) as e:
        front.expand([2, 50, 51], [_input(_image(8, 8, 0), "messages[0].content[1]")])
    assert e.value.part == "messages[0].content[1]"


def test_config_forms_and_refusals(tmp_path: Path, hf: tuple[Path, Any, Any]) -> None:
    folder, _, _ = hf
    cfg = json.loads((folder / "config.json").read_text())
    nested = vision_arch(cfg)
    flat = {k: v for k, v in cfg.items() if k != "vision_config"}
    flat |= {f"vision_{k}": v for k, v in cfg["vision_config"].items()}
    assert vision_arch(flat) == nested
    assert (nested.mm_tokens_per_image, nested.pool_kernel, nested.image_token_id) == (4, 2, 114)
    # a released config.json names only what differs from SigLIP's defaults
    released = {**cfg, "vision_config": {k: cfg["vision_config"][k] for k in ("hidden_size", "image_size")}}
    rel = vision_arch(released)
    assert (rel.layer_norm_eps, rel.hidden_act, rel.num_layers, rel.patch_size) == (1e-6, "gelu_tanh", 12, 16)
    with pytest.raises(ConfigError, match="mm_tokens_per_image"):
        vision_arch({**cfg, "mm_tokens_per_image": 3})
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_pan_and_scan": True}))
    with pytest.raises(ConfigError, match="do_pan_and_scan"):
        preprocess_spec(tmp_path, nested)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 64, "width": 64}}))
    with pytest.raises(ConfigError, match="size 64x64"):
        preprocess_spec(tmp_path, nested)
