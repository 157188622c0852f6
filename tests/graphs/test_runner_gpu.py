"""GraphRunner on CUDA with flashinfer: replayed decode steps give the eager tokens (skipped on CPU).

A tiny random bf16 decoder (head_dim 64: kernels the GPU kit has precompiled) prefills 7 prompts,
then decodes while sequences finish: batch 7, 7, 6, 5, 4, 3, 2, 1 over buckets 1, 2, 4, 8, so most
steps replay a padded graph. The reference is the plain, unpadded eager step on its own KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel, KVCache, allocate_kv_cache, build_model
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner


def _ready() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _ready(), reason="needs CUDA and flashinfer")]

BLOCK, WIDTH, NSEQ = 16, 4, 7
ARCH = ModelArch(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    max_position=128,
)


@dataclass(frozen=True)
class Settings:
    enabled: str = "on"
    buckets: tuple[int, ...] = (1, 2, 4, 8)
    compile_mode: str = "none"


class Decoder:
    """graphs' DecodeModel over DecoderModel (the model runner's adapter)."""

    def __init__(self, model: DecoderModel, caches: list[KVCache]) -> None:
        self.model, self.caches = model, caches
        self.meta: AttentionMetadata | None = None

    def prepare_decode(self, batch: DecodeBatch) -> None:
        self.meta = AttentionMetadata(
            batch.slot_mapping,
            batch.query_start,
            batch.seq_lens,
            batch.block_tables,
            [1] * batch.num_rows,
            batch.seq_lens_cpu,
            BLOCK,
            0,
        )
        self.model.backend.begin_step(self.meta)

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        assert self.meta is not None
        return self.model(batch.input_ids, batch.positions, self.caches, self.meta)


def _table(s: int) -> list[int]:
    return [1 + s * WIDTH + j for j in range(WIDTH)]


def _prefill(model: DecoderModel, caches: list[KVCache], prompts: list[list[int]]) -> list[int]:
    lens = [len(p) for p in prompts]
    slots = [_table(s)[i // BLOCK] * BLOCK + i % BLOCK for s, p in enumerate(prompts) for i in range(len(p))]
    qstart = [0, *torch.tensor(lens).cumsum(0).tolist()]
    cuda = torch.device("cuda")
    meta = AttentionMetadata(
        torch.tensor(slots, device=cuda),
        torch.tensor(qstart, dtype=torch.int32, device=cuda),
        torch.tensor(lens, dtype=torch.int32, device=cuda),
        torch.tensor([_table(s) for s in range(len(prompts))], dtype=torch.int32, device=cuda),
        lens,
        lens,
        BLOCK,
        num_prefills=len(prompts),
    )
    model.backend.begin_step(meta)
    ids = torch.tensor([t for p in prompts for t in p], device=cuda)
    pos = torch.tensor([i for p in prompts for i in range(len(p))], device=cuda)
    hidden = model(ids, pos, caches, meta)
    last = torch.tensor(qstart[1:], device=cuda) - 1
    return model.compute_logits(hidden[last]).argmax(-1).tolist()


def _batch(live: list[int], last: list[int], lens: list[int]) -> DecodeBatch:
    cuda = torch.device("cuda")
    pos = [lens[s] for s in live]
    return DecodeBatch(
        input_ids=torch.tensor([last[s] for s in live], device=cuda),
        positions=torch.tensor(pos, device=cuda),
        slot_mapping=torch.tensor(
            [_table(s)[p // BLOCK] * BLOCK + p % BLOCK for s, p in zip(live, pos, strict=True)], device=cuda
        ),
        seq_lens=torch.tensor([p + 1 for p in pos], dtype=torch.int32, device=cuda),
        block_tables=torch.tensor([_table(s) for s in live], dtype=torch.int32, device=cuda),
        query_start=torch.arange(len(live) + 1, dtype=torch.int32, device=cuda),
        seq_lens_cpu=[p + 1 for p in pos],
    )


def _setup(settings: Settings) -> tuple[DecoderModel, GraphRunner, Decoder, list[int], list[list[int]]]:
    from rillet.core.attention.flashinfer_backend import FlashInferAttentionBackend

    backend = FlashInferAttentionBackend(
        ARCH.num_heads,
        ARCH.num_kv_heads,
        ARCH.head_dim,
        BLOCK,
        torch.bfloat16,
        "cuda",
        graph_batch_sizes=settings.buckets,
        max_blocks_per_seq=WIDTH,
    )
    model = build_model(ARCH, backend, torch.bfloat16, "cuda")
    model.init_random(seed=0, std=0.3)  # peaky logits: greedy tokens do not hinge on bf16 rounding
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 512, (int(n),), generator=g).tolist() for n in (3, 17, 1, 30, 9, 16, 24)]
    graph_kv, eager_kv = (
        allocate_kv_cache(ARCH, 1 + WIDTH * NSEQ, BLOCK, torch.bfloat16, "cuda") for _ in range(2)
    )
    first = _prefill(model, graph_kv, prompts)
    assert _prefill(model, eager_kv, prompts) == first
    runner = GraphRunner(
        Decoder(model, graph_kv), settings, max_num_seqs=8, max_blocks_per_seq=WIDTH, device="cuda"
    )
    runner.capture()
    return model, runner, Decoder(model, eager_kv), first, prompts


@torch.inference_mode()
@pytest.mark.parametrize("compile_mode", ["none", "default"])
def test_replayed_decode_equals_eager(compile_mode: str) -> None:
    model, runner, eager, first, prompts = _setup(Settings(compile_mode=compile_mode))
    assert runner.captured_buckets == (1, 2, 4, 8)
    lens, last, live = [len(p) for p in prompts], list(first), list(range(NSEQ))
    for step in range(8):  # batch 7, 7, 6, 5, 4, 3, 2, 1
        batch = _batch(live, last, lens)
        got = runner.run(batch)
        got_tokens = model.compute_logits(got).argmax(-1).tolist()  # before the next replay reuses `got`
        eager.prepare_decode(batch)
        want = eager.forward_decode(batch)
        assert got_tokens == model.compute_logits(want).argmax(-1).tolist(), f"step {step}, batch {len(live)}"
        torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
        for s, t in zip(live, got_tokens, strict=True):
            last[s], lens[s] = t, lens[s] + 1
        if step >= 1:
            live.pop(step % len(live))
    assert runner.num_replays == 8 and runner.num_eager == 0


@torch.inference_mode()
def test_above_largest_bucket_is_eager() -> None:
    model, runner, eager, first, prompts = _setup(Settings(buckets=(1, 2, 4)))
    batch = _batch(list(range(NSEQ)), first, [len(p) for p in prompts])
    got = model.compute_logits(runner.run(batch)).argmax(-1).tolist()
    eager.prepare_decode(batch)
    assert got == model.compute_logits(eager.forward_decode(batch)).argmax(-1).tolist()
    assert runner.num_eager == 1 and runner.num_replays == 0
