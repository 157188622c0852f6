"""Embeddings through the engine (LLM.embed) equal sentence-transformers' own, for a tiny random BERT
and a tiny random decoder saved as sentence-transformers folders: batched and alone, over chunked
prefills and prefix-cache hits; `model.task: both` serves chat and embeddings from one engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rillet.core.config import ConfigError
from rillet.core.llm import LLM
from rillet.core.model.encoder import EncoderLayer
from rillet.core.model.packed_linear import onednn_available
from rillet.core.runner.encoder_runner import EncoderRunner
from rillet.core.sampling_params import SamplingParams

TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "a",
    "red sun , blue moon ! night sky and stars over the river ?" * 2,
    "zebra quokka",  # words outside the tiny vocabulary: word pieces and [UNK]
]
StFolder = Callable[..., Path]


def reference(folder: Path) -> Any:
    """sentence-transformers' own model over the folder (fp32, CPU): the vectors rillet must equal."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


def cosines(a: Any, b: Any) -> list[float]:
    """Row-wise cosine similarity of two [N, D] arrays."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return list((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


def _embed_all(llm: LLM, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    batched = np.array(llm.embed(texts))
    alone = np.array([llm.embed([t])[0] for t in texts])
    return batched, alone


def _assert_whole(llm: LLM) -> None:
    assert llm.engine.wait_idle(10)
    llm.engine.core.blocks.check_integrity()
    assert llm.engine.stats().kv_blocks_used == 0


def _check(folder: Path, *overrides: str, texts: list[str] = TEXTS) -> LLM:
    want = reference(folder).encode(texts)
    with LLM(overrides=[f"model.path={folder}", "cache.num_blocks=256", *overrides]) as llm:
        batched, alone = _embed_all(llm, texts)
        assert min(cosines(want, batched)) >= 0.9999, cosines(want, batched)
        assert min(cosines(want, alone)) >= 0.9999, cosines(want, alone)
        assert np.allclose(np.linalg.norm(batched, axis=1), np.linalg.norm(want, axis=1), rtol=1e-4)
        _assert_whole(llm)
        return llm


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", True), ("cls", False), ("lasttoken", True)])
def test_bert_equals_sentence_transformers(st_folder: StFolder, pooling: str, normalize: bool) -> None:
    llm = _check(st_folder("bert", pooling=pooling, normalize=normalize))
    assert llm.engine.tasks == frozenset({"embed"}) and llm.engine.embedding_size == 32
    runner = llm.engine.runtime.runner
    assert isinstance(runner, EncoderRunner) and llm.engine.core.embed_share is None  # no chat to share with
    layer = runner.model.layers[0]
    assert isinstance(layer, EncoderLayer)  # its projections run on oneDNN where torch has it
    assert (layer.up.packed is not None) is onednn_available(torch.empty(1))
    assert llm.engine.max_model_len == 48  # the folder's max_seq_length


def test_bert_batch_of_mixed_lengths_runs_in_length_groups(st_folder: StFolder) -> None:
    texts = ["a"] * 5 + ["the cat sat on the mat " * 5] * 3 + ["hello world"] * 4
    _check(st_folder("bert"), texts=texts)


@pytest.mark.parametrize(
    "chunking",
    [[], ["scheduler.max_num_batched_tokens=16", "scheduler.max_num_seqs=4", "cache.block_size=8"]],
    ids=["whole", "chunked"],
)
@pytest.mark.parametrize("pooling", ["lasttoken", "mean", "cls"])
def test_decoder_equals_sentence_transformers(st_folder: StFolder, pooling: str, chunking: list[str]) -> None:
    _check(st_folder("decoder", pooling=pooling), *chunking)


def test_a_bare_base_decoder_folder_embeds(st_folder: StFolder) -> None:
    """A decoder saved as its base model without sentence-transformers' files (LlamaModel: no LM
    head, no `model.` prefix, as e5-mistral's folder): model.task auto embeds, last token and
    normalized, which is what the sentence-transformers folder built around it says."""
    folder = st_folder("decoder")  # lasttoken, normalized; its Transformer module is folder/../hf
    want = reference(folder).encode(TEXTS)
    with LLM(overrides=[f"model.path={folder.parent / 'hf'}", "cache.num_blocks=256"]) as llm:
        got = np.array(llm.embed(TEXTS))
        assert min(cosines(want, got)) >= 0.9999, cosines(want, got)
        _assert_whole(llm)


def test_decoder_prefix_cache_hits_serve_lasttoken_only(st_folder: StFolder) -> None:
    long_text = "the quick brown fox jumps over the lazy dog " * 4
    small = ["cache.block_size=8"]
    for pooling, hits in (("lasttoken", True), ("mean", False)):
        folder = st_folder("decoder", pooling=pooling)
        want = reference(folder).encode([long_text])
        with LLM(overrides=[f"model.path={folder}", "cache.num_blocks=64", *small]) as llm:
            first = llm.embed([long_text])
            again = llm.embed([long_text])  # its leading blocks are in the prefix cache now
            assert min(cosines(want, [first[0], again[0]])) >= 0.9999
            assert (llm.engine.stats().cached_prompt_tokens > 0) is hits
            _assert_whole(llm)


def test_dimensions_truncate_and_renormalize(st_folder: StFolder) -> None:
    with LLM(overrides=[f"model.path={st_folder('bert')}"]) as llm:
        full = np.array(llm.embed(TEXTS))
        short = np.array(llm.embed(TEXTS, dimensions=8))
    want = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    assert short.shape == (len(TEXTS), 8)
    assert np.allclose(short, want, atol=1e-6)


@pytest.fixture(scope="module")
def both(tiny_hf_model: Any) -> Iterator[tuple[LLM, Any]]:
    folder, hf = tiny_hf_model("llama", vocab_size=49152)
    with LLM(overrides=[f"model.path={folder}", "model.task=both", "cache.num_blocks=128"]) as llm:
        yield llm, hf


def test_task_both_serves_chat_and_embeddings_from_one_engine(both: tuple[LLM, Any]) -> None:
    llm, hf = both
    assert llm.engine.core.embed_share is not None  # chat and embeddings share the engine's time
    ids = [llm.tokenizer.encode(t) for t in TEXTS]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    # chat and embeddings in the same steps: submitted together, sharing the token budget
    rids = [f"e{i}" for i in range(len(ids))]
    for rid, p in zip(rids, ids, strict=True):
        llm.engine.add_embedding(rid, p)
    mixed = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
    assert mixed == alone
    with torch.no_grad():
        for p, v in zip(ids, llm.embed(ids), strict=True):
            h = hf.model(torch.tensor([p])).last_hidden_state[0, -1]  # the base model's last row
            assert cosines([h.numpy()], [v])[0] >= 0.9999
            assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5  # normalize auto: on without a folder
    _assert_whole(llm)


def test_config_errors_name_the_key(st_folder: StFolder, tiny_hf_model: Any) -> None:
    bert = st_folder("bert")
    cases = [
        ([f"model.path={bert}", "model.task=both"], "model.task"),
        (
            [f"model.path={bert}", "scheduler.max_num_batched_tokens=32", "scheduler.max_num_seqs=8"],
            "scheduler.max_num_batched_tokens",
        ),
        ([f"model.path={st_folder('decoder')}", "model.task=both"], "model.task"),  # no LM head
        ([f"model.path={st_folder('decoder').parent / 'hf'}", "model.task=generate"], "model.task"),  # bare
    ]
    for overrides, key in cases:
        with pytest.raises(ConfigError) as err:
            LLM(overrides=overrides)
        assert err.value.key == key, err.value


def test_chat_model_refuses_embeddings_and_embedding_model_refuses_chat(st_folder: StFolder) -> None:
    from rillet.core.errors import RequestError

    with LLM(overrides=[f"model.path={st_folder('bert')}"]) as llm:
        with pytest.raises(RequestError, match="embedding model"):
            llm.engine.add_request("x", [2, 7, 3], SamplingParams(max_tokens=2))
        with pytest.raises(RequestError, match="exceed"):
            llm.engine.add_embedding("y", [7] * 49)


def test_task_both_with_overlapped_steps(tiny_hf_model: Any) -> None:
    """engine.overlap on (as on CUDA): an embedding's last chunk is in flight while the next step
    is scheduled; chat and embeddings come out as with synchronous steps."""
    folder, _ = tiny_hf_model("llama", vocab_size=49152)
    small = ["scheduler.max_num_batched_tokens=16", "scheduler.max_num_seqs=8", "cache.block_size=8"]
    out = {}
    for overlap in ("off", "on"):
        config = [f"model.path={folder}", "model.task=both", f"engine.overlap={overlap}", *small]
        with LLM(overrides=[*config, "cache.num_blocks=128"]) as llm:
            ids = [llm.tokenizer.encode(t) for t in TEXTS]
            for i, p in enumerate(ids):
                llm.engine.add_embedding(f"x{i}", p)  # their vectors go unread: they share the steps
            params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
            gen = [o.outputs[0].token_ids for o in llm.generate(ids, params)]
            out[overlap] = (gen, np.array(llm.embed(TEXTS)))
            _assert_whole(llm)
    assert out["on"][0] == out["off"][0]
    assert np.allclose(out["on"][1], out["off"][1], atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", ["bert", "decoder"])
def test_embeddings_on_cuda_equal_sentence_transformers(st_folder: StFolder, family: str) -> None:
    _check(st_folder(family), "model.device=cuda", "model.dtype=float32")


def test_padding_and_truncation_in_tokenizer_json_are_ignored(st_folder: StFolder, tmp_path: Path) -> None:
    """Older sentence-transformers folders (all-MiniLM-L6-v2's) save a tokenizer.json that pads to
    a fixed 128 and cuts at 128; transformers ignores both, and so must rillet."""
    import json
    import shutil

    folder = tmp_path / "st"
    shutil.copytree(st_folder("bert"), folder)
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["truncation"] = {"max_length": 6, "strategy": "LongestFirst", "stride": 0}
    tok["padding"] = {
        "strategy": {"Fixed": 40},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "[PAD]",
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    _check(folder)
