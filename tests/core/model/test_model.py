"""The decoder against transformers: full-prompt logits, and chunked prefill + greedy decode through
the paged cache (several sequences in one flat batch, shuffled block tables) token for token."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.loaders.hf import load_hf_folder
from rillet.core.model.decoder import DecoderModel, allocate_kv_cache, build_model

BLOCK = 4
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-untied-llama3": ("llama", {"num_hidden_layers": 3, "rope_scaling": LLAMA3}),
    "smollm2-like": (
        "llama",
        {"hidden_size": 96, "num_attention_heads": 6, "tie_word_embeddings": True, "rope_theta": 100000.0},
    ),
    "mistral": ("mistral", {"sliding_window": None}),
    "mistral-window": ("mistral", {"sliding_window": 6}),  # every layer slides
    "qwen2-bias-linear": (
        "qwen2",
        {"tie_word_embeddings": True, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ),
    # the other families, as tiny_models/hf_folders.py's FAMILY_DEFAULTS make them (sliding windows of 8)
    "qwen3": ("qwen3", {}),
    "gemma2": ("gemma2", {}),
    "gemma3": ("gemma3_text", {}),
    "phi3-longrope": ("phi3", {}),
    "mixtral": ("mixtral", {}),
    "qwen3-moe": ("qwen3_moe", {}),
}


# LongRoPE picks its factors by the RoPE table's length (core/model/rope.py): a table of the
# original 48 positions keeps the short ones, which transformers uses for these short prompts
TABLE = {"phi3-longrope": 48}


def load(folder: Any, dtype: torch.dtype = torch.float32, max_position: int | None = None) -> DecoderModel:
    arch, weights = load_hf_folder(folder, dtype)
    model = build_model(arch, TorchAttentionBackend(), dtype, "cpu", max_position)
    model.load_weights(weights)
    return model


def make_step(
    entries: list[tuple[list[int], int, list[int]]],  # (new tokens, first position, block table)
    num_prefills: int,
    pad_rows: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    for toks, start, table in entries:
        ids += toks
        for p in range(start, start + len(toks)):
            pos.append(p)
            slots.append(table[p // BLOCK] * BLOCK + p % BLOCK)
    ids += [0] * pad_rows
    pos += [0] * pad_rows
    slots += [-1] * pad_rows
    qlens = [len(t) for t, _, _ in entries]
    slens = [s + len(t) for t, s, _ in entries]
    width = max(len(t) for _, _, t in entries)
    tables = [t + [0] * (width - len(t)) for _, _, t in entries]
    qstart = [0]
    for n in qlens:
        qstart.append(qstart[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start=torch.tensor(qstart, dtype=torch.int32),
        seq_lens=torch.tensor(slens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        query_lens_cpu=qlens,
        seq_lens_cpu=slens,
        block_size=BLOCK,
        num_prefills=num_prefills,
    )
    return torch.tensor(ids), torch.tensor(pos), meta


def prefill_logits(model: DecoderModel, prompt: list[int]) -> torch.Tensor:
    kv = allocate_kv_cache(model.arch, 64, BLOCK, model.embed_tokens.dtype, "cpu")
    table = list(range(1, 1 + -(-len(prompt) // BLOCK)))
    ids, pos, meta = make_step([(prompt, 0, table)], num_prefills=1)
    with torch.inference_mode():
        return model.compute_logits(model(ids, pos, kv, meta))


@dataclass
class Seq:
    prompt: list[int]
    chunks: list[int]  # prompt chunk sizes, one per step
    table: list[int]
    done: int = 0  # tokens whose K/V is cached
    out: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


def run_paged(model: DecoderModel, seqs: list[Seq], n_new: int, num_blocks: int) -> None:
    """A miniature engine: prefill chunks first, then decodes, two padding rows, greedy sampling."""
    kv = allocate_kv_cache(model.arch, num_blocks, BLOCK, model.embed_tokens.dtype, "cpu")
    while any(len(s.out) < n_new for s in seqs):
        pre = [s for s in seqs if s.chunks]
        dec = [s for s in seqs if not s.chunks and len(s.out) < n_new]
        entries = []
        for s in pre:
            n = s.chunks.pop(0)
            entries.append((s.prompt[s.done : s.done + n], s.done, s.table))
        entries += [([s.out[-1]], s.done, s.table) for s in dec]
        ids, pos, meta = make_step(entries, len(pre), pad_rows=2)
        with torch.inference_mode():
            hidden = model(ids, pos, kv, meta)
            logits = model.compute_logits(hidden[meta.query_start[1:].long() - 1])
        for s, (toks, _, _), row in zip(pre + dec, entries, logits, strict=True):
            s.done += len(toks)
            if s.done >= len(s.prompt):  # last prompt chunk or a decode: this row samples
                s.out.append(int(row.argmax()))
                s.logits.append(row)


def hf_greedy(hf: Any, prompt: list[int], n_new: int) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        r = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return r.sequences[0, len(prompt) :].tolist(), torch.cat(r.logits).float()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_full_prompt_logits_match_hf(tiny_hf_model: Any, name: str) -> None:
    model_type, overrides = CONFIGS[name]
    folder, hf = tiny_hf_model(model_type, **overrides)
    model = load(folder, max_position=TABLE.get(name))
    prompt = torch.randint(0, 256, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(prefill_logits(model, prompt), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_chunked_prefill_and_decode_match_hf_generate(tiny_hf_model: Any, name: str) -> None:
    model_type, overrides = CONFIGS[name]
    folder, hf = tiny_hf_model(model_type, **overrides)
    model = load(folder, max_position=TABLE.get(name))
    rng = random.Random(name)
    chunkings = [[7], [5, 8], [6, 6, 9], [3], [2, 11]]
    n_new, num_blocks = 10, 48
    pool = list(range(1, num_blocks))  # block 0 is the dummy block
    rng.shuffle(pool)
    seqs = []
    for chunks in chunkings:
        plen = sum(chunks)
        nblk = -(-(plen + n_new) // BLOCK)
        table, pool = pool[:nblk], pool[nblk:]
        seqs.append(Seq([rng.randrange(256) for _ in range(plen)], list(chunks), table))
    run_paged(model, seqs, n_new, num_blocks)
    for s in seqs:
        tokens, logits = hf_greedy(hf, s.prompt, n_new)
        assert s.out == tokens
        torch.testing.assert_close(torch.stack(s.logits), logits, atol=1e-4, rtol=1e-4)


def test_bf16_close_to_fp32(tiny_hf_model: Any) -> None:
    model_type, overrides = CONFIGS["smollm2-like"]
    folder, hf = tiny_hf_model(model_type, **overrides)
    prompt = list(range(3, 40, 2))
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    model = load(folder, torch.bfloat16)
    assert model.embed_tokens.dtype == torch.bfloat16
    got = prefill_logits(model, prompt)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8
    seqs = [Seq(prompt, [9, 10], [5, 3, 8, 1, 7, 2, 4]), Seq(prompt[:6], [6], [6, 9, 10, 11])]
    run_paged(model, seqs, 6, 12)
    first = torch.stack(seqs[0].logits[:1])
    assert (first - ref[-1:]).abs().max() < 0.1 * ref.abs().max()


def test_sharded_folder_loads_the_same(tiny_hf_model: Any) -> None:
    folder, hf = tiny_hf_model("llama", max_shard_size="100KB")
    assert len(list(folder.glob("*.safetensors"))) > 1
    prompt = [5, 9, 2, 200, 17]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(prefill_logits(load(folder), prompt), ref, atol=1e-4, rtol=1e-4)


def test_load_weights_rejects_unknown_missing_and_misshapen(tiny_hf_model: Any) -> None:
    folder, _ = tiny_hf_model("llama")
    arch, weights = load_hf_folder(folder)
    named = dict(weights)
    model = build_model(arch, TorchAttentionBackend(), torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"unknown weight 'model\.layers\.0\.mlp\.extra\.weight'"):
        model.load_weights([*named.items(), ("model.layers.0.mlp.extra.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"missing weights \['model.norm.weight'\]"):
        model.load_weights((k, v) for k, v in named.items() if k != "model.norm.weight")
    bad = {**named, "model.layers.1.self_attn.k_proj.weight": torch.zeros(3, 64)}
    with pytest.raises(ValueError, match=r"k_proj.weight' has shape \(3, 64\), expected \(32, 64\)"):
        model.load_weights(bad.items())


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "dynamic", "factor": 2.0},
        LLAMA3,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    ],
    ids=lambda s: "default" if s is None else s["rope_type"],
)
def test_rope_table_matches_hf(tiny_hf_model: Any, scaling: dict[str, Any] | None) -> None:
    folder, hf = tiny_hf_model("llama", num_hidden_layers=1, rope_scaling=scaling)
    arch, _ = load_hf_folder(folder)
    rope = build_model(arch, TorchAttentionBackend(), torch.float32, "cpu").rope
    positions = torch.arange(arch.max_position)
    cos_ref, sin_ref = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions[None])
    cos, sin = rope.cos_sin(positions)
    half = arch.head_dim // 2  # rillet's tables: cos [c | c], sin [-s | s]
    torch.testing.assert_close(cos[:, 0], cos_ref[0], atol=1e-6, rtol=0)
    unsigned = torch.cat([-sin[:, 0, :half], sin[:, 0, half:]], -1)
    torch.testing.assert_close(unsigned, sin_ref[0], atol=1e-6, rtol=0)


def test_longrope_long_factors_past_the_original_context(tiny_hf_model: Any) -> None:
    """A RoPE table longer than Phi-3's original context (48) holds the long factors: the logits of
    a 60-token prompt (transformers switches to them for a sequence that long) and its table rows."""
    folder, hf = tiny_hf_model("phi3")
    model = load(folder)  # the whole 256 positions
    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(prefill_logits(model, prompt), ref, atol=1e-4, rtol=1e-4)
    positions = torch.arange(256)
    cos_ref, _ = hf.model.rotary_emb(torch.zeros(1), positions[None])  # all 256: the long factors
    torch.testing.assert_close(model.rope.cos_sin(positions)[0][:, 0], cos_ref[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_kv_cache_is_separate_zeroed_tensors_per_layer(tiny_hf_model: Any, dtype: torch.dtype) -> None:
    folder, _ = tiny_hf_model("llama")
    arch, _ = load_hf_folder(folder)
    kv = allocate_kv_cache(arch, 10, BLOCK, dtype, "cpu")
    assert len(kv) == arch.num_layers
    storages = set()
    for k, v, scales in kv:
        assert k.shape == v.shape == (10, BLOCK, arch.num_kv_heads, arch.head_dim)
        assert k.dtype == dtype and k.is_contiguous() and v.is_contiguous()
        storages |= {k.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()}
        assert not k.any() and not v.any()
        # int8 codes carry a float32 scale per token per KV head, zeroed and unaliased as well
        assert (scales is not None) == (dtype == torch.int8)
        for s in scales or ():
            assert s.shape == (10, BLOCK, arch.num_kv_heads) and s.dtype == torch.float32 and not s.any()
            storages.add(s.untyped_storage().data_ptr())
    # no two alias: the compiled decode step writes them in place (aliased inputs would be copied)
    assert len(storages) == (4 if dtype == torch.int8 else 2) * arch.num_layers
