"""A tiny Qwen2-VL folder saved by transformers, served by the engine (offline API) with images:
greedy tokens and the first step's logprobs equal transformers' generate for one image, two images
of different sizes, text only and an image prompt batched with a text one; the prefix cache hits
on the same image and misses on a different image of the same size; a repeated image is encoded
once; a prefill chunk boundary inside an image changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rillet.core.llm import LLM, RequestOutput
from rillet.core.sampling_params import SamplingParams
from rillet.core.vision.image import ImageInput
from rillet.core.vision.mm_step import VisionStats
from tiny_models.qwen_vl import IMAGE_TOKEN_ID, chat_ids, hf_generate, make_qwen_vl, png

MAX_NEW = 6
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, logprobs=2)
ATOL = 1e-4  # fp32 logprobs through a different summation order


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def qwen(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    folder = tmp_path_factory.mktemp(request.param)
    model, processor = make_qwen_vl(folder, request.param)
    return folder, model, processor


@pytest.fixture(scope="module")
def llm(qwen: tuple[Path, Any, Any]) -> Iterator[LLM]:
    with LLM(overrides=[f"model.path={qwen[0]}", "cache.num_blocks=256"]) as engine:
        yield engine


def _stats(llm: LLM) -> VisionStats:
    vision = llm.engine.runtime.runner.vision  # type: ignore[attr-defined]
    assert vision is not None
    stats: VisionStats = vision.stats
    return stats


def _check(qwen: tuple[Path, Any, Any], got: RequestOutput, ids: list[int], images: list[ImageInput]) -> None:
    _, model, processor = qwen
    expanded, want, logprobs = hf_generate(model, processor, ids, images, MAX_NEW)
    assert got.prompt_ids == expanded
    out = got.outputs[0]
    assert out.token_ids == want
    assert out.logprobs is not None
    first = out.logprobs[0]
    assert first.logprob == pytest.approx(float(logprobs[want[0]]), abs=ATOL)
    assert [t for t, _ in first.top] == logprobs.topk(2).indices.tolist()


CASES = {
    "one image": ([(1, 40, 60)], "What is in the picture?"),
    "two sizes": ([(2, 70, 30), (3, 40, 90)], "Compare the two."),
    "text only": ([], "Tell me a story."),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_transformers(qwen: tuple[Path, Any, Any], llm: LLM, case: str) -> None:
    shapes, text = CASES[case]
    images = [png(*s) for s in shapes]
    ids = chat_ids(len(images), text)
    got = llm.generate([ids], GREEDY, images=[images])[0]
    _check(qwen, got, ids, images)


def test_batched_with_a_text_request(qwen: tuple[Path, Any, Any], llm: LLM) -> None:
    image = [png(4, 50, 50)]
    ids_img, ids_txt = chat_ids(1, "Describe."), chat_ids(0, "Hello there, how are you?")
    got = llm.generate([ids_img, ids_txt], GREEDY, images=[image, []])
    _check(qwen, got[0], ids_img, image)
    _check(qwen, got[1], ids_txt, [])


def test_multi_turn_with_images(qwen: tuple[Path, Any, Any], llm: LLM) -> None:
    """An image in the first turn, an answer, another image in the second turn."""
    history = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": "A pattern of dots."},
    ]
    images = [png(31, 60, 60), png(32, 40, 100)]
    ids = chat_ids(1, "And this one?", history)
    got = llm.generate([ids], GREEDY, images=[images])[0]
    _check(qwen, got, ids, images)


def test_prefix_cache_keys_on_the_image(qwen: tuple[Path, Any, Any], llm: LLM) -> None:
    ids = chat_ids(1, "Which colour dominates here?")
    first, same, other = [png(10, 56, 84)], [png(10, 56, 84)], [png(11, 56, 84, level=255)]
    a = llm.generate([ids], GREEDY, images=[first])[0]
    image = [i for i, t in enumerate(a.prompt_ids) if t == IMAGE_TOKEN_ID]
    block = llm.engine.cfg.cache.block_size
    encoded = _stats(llm).images_encoded
    b = llm.generate([ids], GREEDY, images=[same])[0]
    assert b.outputs[0].cached_tokens >= (image[-1] + 1) // block * block  # hits past the image
    assert b.outputs[0].token_ids == a.outputs[0].token_ids
    assert _stats(llm).images_encoded == encoded  # the repeated image came from the encoder cache
    c = llm.generate([ids], GREEDY, images=[other])[0]
    assert c.prompt_ids == a.prompt_ids  # same size: the same placeholder ids
    assert c.outputs[0].cached_tokens <= image[0]  # no block holding the other image's tokens
    _check(qwen, c, ids, other)
    # transformers tells the two images apart (the tiny model's greedy tokens may agree, its
    # logprobs do not): a hit on the first image's blocks would have given the first's numbers
    _, _, lp_a = hf_generate(qwen[1], qwen[2], ids, first, MAX_NEW)
    _, _, lp_c = hf_generate(qwen[1], qwen[2], ids, other, MAX_NEW)
    assert (lp_a - lp_c).abs().max() > 100 * ATOL
    assert a.outputs[0].logprobs is not None and c.outputs[0].logprobs is not None
    assert abs(a.outputs[0].logprobs[0].logprob - c.outputs[0].logprobs[0].logprob) > 10 * ATOL


def test_chunk_boundary_inside_an_image(qwen: tuple[Path, Any, Any]) -> None:
    small = ["scheduler.max_num_batched_tokens=20", "scheduler.max_num_seqs=4", "cache.num_blocks=64"]
    images = [png(5, 112, 168), png(6, 56, 112)]  # 24 and 8 image tokens
    ids = chat_ids(2, "Two pictures.")
    with LLM(overrides=[f"model.path={qwen[0]}", *small]) as chunked:
        got = chunked.generate([ids], GREEDY, images=[images])[0]
        assert _stats(chunked).images_encoded == 2  # each image once, sliced across its chunks
    image = [i for i, t in enumerate(got.prompt_ids) if t == IMAGE_TOKEN_ID]
    assert any(image[0] < k < image[23] for k in range(20, len(got.prompt_ids), 20))  # a cut inside
    _check(qwen, got, ids, images)


def test_encoder_budget_spreads_images_over_steps(
    qwen: tuple[Path, Any, Any], llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests with a 24-token image each: under the default budget one tower batch encodes
    both; under a budget of 16 image tokens a step each step starts one image (the first always
    goes), so the tower runs twice, and the answers are transformers' all the same."""
    from rillet.core.vision import attach

    runs = _stats(llm).tower_runs
    llm.generate([chat_ids(1, "Look.")] * 2, GREEDY, images=[[png(17, 112, 168)], [png(18, 168, 112)]])
    assert _stats(llm).tower_runs == runs + 1
    monkeypatch.setattr(attach, "ENCODER_BUDGET_TOKENS", 16)
    images = [[png(7, 112, 168)], [png(8, 168, 112)]]
    ids = chat_ids(1, "Look.")
    with LLM(overrides=[f"model.path={qwen[0]}", "cache.num_blocks=64"]) as budgeted:
        got = budgeted.generate([ids, ids], GREEDY, images=images)
        assert _stats(budgeted).tower_runs == 2
    for out, imgs in zip(got, images, strict=True):
        _check(qwen, out, ids, imgs)


def test_decode_through_the_graph_runner(qwen: tuple[Path, Any, Any], llm: LLM) -> None:
    """The decode step's graph path (static buffers, padded to a bucket; run eagerly here, as the
    compiled step runs the same forward on them) takes each row's position + its M-RoPE delta:
    an image request batched with a text one answers as transformers."""
    from rillet.core.config import GraphConfig
    from rillet.core.runner.graph_adapter import DecoderGraphAdapter
    from rillet.core.runner.model_runner import ModelRunner
    from rillet.graphs.runner import GraphRunner

    runner = llm.engine.core.runner
    assert isinstance(runner, ModelRunner)
    before = runner.graph_runner  # never compiled in this module (tests/conftest.py)
    graphs = GraphRunner(
        DecoderGraphAdapter(runner.model, runner.kv_caches, runner.block_size),
        GraphConfig(enabled="off", buckets=(1, 2, 4)),
        max_num_seqs=4,
        max_blocks_per_seq=64,
        device="cpu",
        pad_eager=True,
    )
    runner.graph_runner = graphs
    try:
        images = [png(21, 84, 56)]
        ids_img, ids_txt = chat_ids(1, "Decode me."), chat_ids(0, "And me, please.")
        got = llm.generate([ids_img, ids_txt, ids_img], GREEDY, images=[images, [], images])
        assert graphs.num_padded_eager > 0  # three rows padded to the bucket of 4
    finally:
        runner.graph_runner = before
    _check(qwen, got[0], ids_img, images)
    _check(qwen, got[1], ids_txt, [])
    assert got[2].outputs[0].token_ids == got[0].outputs[0].token_ids
