"""GraphRunner on CPU: the padded (bucket) path gives the plain forward's rows, for a stand-in model
and for the real decoder with the torch attention backend."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.model.arch import ModelArch
from rillet.core.model.decoder import DecoderModel, KVCache, allocate_kv_cache, build_model
from rillet.graphs.decode_mode import resolve_decode_mode
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner

BLOCK = 4
WIDTH = 8  # blocks per sequence: contexts up to 32 tokens


@dataclass(frozen=True)
class Settings:
    enabled: str = "auto"
    buckets: tuple[int, ...] = (1, 2, 4, 8)
    compile_mode: str = "none"


class RowModel(torch.nn.Module):
    """Each output row is a function of that row's inputs only (id, position, context, blocks),
    with distinct values per row, so a row read from the wrong place or padding leaking into a
    real row changes the result. Integer-valued weights: sums are exact whatever the table width."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.tok, self.pos, self.blk = (
            torch.nn.Parameter(
                torch.randint(-1000, 1000, (rows, 8), generator=g).float(), requires_grad=False
            )
            for rows in (64, 64, 128)
        )
        self.prepared: list[tuple[int, list[int]]] = []

    def prepare_decode(self, batch: DecodeBatch) -> None:
        self.prepared.append((batch.num_rows, list(batch.seq_lens_cpu)))

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:  # [n, 8]
        pages = (batch.seq_lens + BLOCK - 1) // BLOCK  # [n]
        used = torch.arange(batch.block_tables.shape[1])[None, :] < pages[:, None]  # [n, W]
        ctx = (self.blk[batch.block_tables.long()] * used[..., None]).sum(1)  # [n, 8]
        slot = batch.slot_mapping.float()[:, None] * 7
        return self.tok[batch.input_ids] + self.pos[batch.positions] + ctx + slot


def _random_batch(n: int, seed: int) -> DecodeBatch:
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, BLOCK * WIDTH, (n,), generator=g, dtype=torch.int32)
    width = (max(seq_lens.tolist(), default=1) + BLOCK - 1) // BLOCK
    return DecodeBatch(
        input_ids=torch.randint(1, 64, (n,), generator=g),
        positions=seq_lens.long() - 1,
        slot_mapping=torch.randint(BLOCK, 512, (n,), generator=g),
        seq_lens=seq_lens,
        block_tables=torch.randint(1, 128, (n, width), generator=g, dtype=torch.int32),
        query_start=torch.arange(n + 1, dtype=torch.int32),
        seq_lens_cpu=seq_lens.tolist(),
    )


def _runner(model: RowModel | DecoderAdapter, pad: bool = True, **settings: object) -> GraphRunner:
    s = Settings(**settings)  # type: ignore[arg-type]
    return GraphRunner(model, s, max_num_seqs=8, max_blocks_per_seq=WIDTH, device="cpu", pad_eager=pad)


@pytest.mark.parametrize("b", [1, 2, 3, 4, 5, 7, 8])
def test_padded_rows_equal_plain_rows(b: int) -> None:
    model = RowModel()
    runner = _runner(model)
    runner.run(_random_batch(8, seed=99))  # a full, different step first: stale rows everywhere
    batch = _random_batch(b, seed=b)
    out = runner.run(batch)
    assert out.shape == (b, 8)
    torch.testing.assert_close(out, model.forward_decode(batch), rtol=0, atol=0)
    bucket = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 7: 8, 8: 8}[b]
    assert model.prepared[-1] == (bucket, batch.seq_lens_cpu + [1] * (bucket - b))
    assert runner.num_padded_eager == 2 and runner.num_eager == 0 and runner.num_replays == 0


def test_above_largest_bucket_runs_eager_unpadded() -> None:
    model = RowModel()
    runner = GraphRunner(
        model,
        Settings(buckets=(1, 2, 4)),
        max_num_seqs=8,
        max_blocks_per_seq=WIDTH,
        device="cpu",
        pad_eager=True,
    )
    batch = _random_batch(6, seed=6)
    out = runner.run(batch)
    torch.testing.assert_close(out, model.forward_decode(batch), rtol=0, atol=0)
    assert model.prepared[-1] == (6, batch.seq_lens_cpu)
    assert runner.num_eager == 1 and runner.num_padded_eager == 0


def test_cpu_default_is_plain_eager() -> None:
    model = RowModel()
    runner = _runner(model, pad=False)
    assert not runner.use_graphs and runner.static is None
    batch = _random_batch(3, seed=3)
    torch.testing.assert_close(runner.run(batch), model.forward_decode(batch), rtol=0, atol=0)
    assert runner.num_eager == 1 and model.prepared[-1] == (3, batch.seq_lens_cpu)


def test_empty_batch_is_an_error() -> None:
    for pad in (True, False):
        with pytest.raises(ValueError, match=">= 1 rows"):
            _runner(RowModel(), pad=pad).run(_random_batch(0, seed=0))


def test_decode_mode_resolution() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def mode(enabled: str, device: torch.device, compile_mode: str = "default") -> str:
        return resolve_decode_mode(Settings(enabled=enabled, compile_mode=compile_mode), device)[0]

    assert mode("auto", cuda) == mode("on", cuda) == "cuda_graphs"
    assert mode("auto", cpu) == mode("on", cpu) == "compiled"  # CPU compiles instead of capturing
    assert mode("off", cuda) == mode("off", cpu) == mode("auto", cpu, "none") == "eager"
    with pytest.raises(ValueError, match=r"'graphs\.enabled': 'on' on CPU .*compile_mode is 'none'"):
        mode("on", cpu, "none")
    with pytest.raises(ValueError, match=r"graphs\.enabled"):
        mode("sometimes", cpu)


def test_on_cpu_capture_is_refused() -> None:
    with pytest.raises(RuntimeError, match="capture"):
        _runner(RowModel()).capture()


# --- the real decoder, torch attention backend ---------------------------------------------------

ARCH = ModelArch(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    max_position=64,
)


class DecoderAdapter:
    """The core side of graphs' DecodeModel for DecoderModel (what the model runner does): the
    step's metadata, lists included, is built on the host in prepare_decode and reused by the
    forward, which then holds no Python value derived from the row count."""

    def __init__(self, model: DecoderModel, kv_caches: list[KVCache]) -> None:
        self.model, self.kv_caches = model, kv_caches
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
            num_prefills=0,
        )
        self.model.backend.begin_step(self.meta)

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        assert self.meta is not None
        return self.model(batch.input_ids, batch.positions, self.kv_caches, self.meta)


def _table(seq: int) -> list[int]:
    return [1 + seq * WIDTH + j for j in range(WIDTH)]  # block 0 stays the dummy


def _prefill(model: DecoderModel, caches: list[KVCache], prompts: list[list[int]]) -> list[int]:
    """Whole prompts, eager; returns each sequence's greedy next token."""
    ids = [t for p in prompts for t in p]
    pos = [i for p in prompts for i in range(len(p))]
    slots = [_table(s)[i // BLOCK] * BLOCK + i % BLOCK for s, p in enumerate(prompts) for i in range(len(p))]
    lens = [len(p) for p in prompts]
    qstart = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        torch.tensor(slots),
        qstart,
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor([_table(s) for s in range(len(prompts))], dtype=torch.int32),
        lens,
        lens,
        BLOCK,
        num_prefills=len(prompts),
    )
    model.backend.begin_step(meta)
    hidden = model(torch.tensor(ids), torch.tensor(pos), caches, meta)
    return model.compute_logits(hidden[qstart[1:].long() - 1]).argmax(-1).tolist()


def _decode_batch(seqs: list[int], last: list[int], lens: list[int]) -> DecodeBatch:
    """One new token per live sequence; lens[s] = tokens already in the cache."""
    pos = [lens[s] for s in seqs]
    return DecodeBatch(
        input_ids=torch.tensor([last[s] for s in seqs]),
        positions=torch.tensor(pos),
        slot_mapping=torch.tensor(
            [_table(s)[p // BLOCK] * BLOCK + p % BLOCK for s, p in zip(seqs, pos, strict=True)]
        ),
        seq_lens=torch.tensor([p + 1 for p in pos], dtype=torch.int32),
        block_tables=torch.tensor([_table(s) for s in seqs], dtype=torch.int32),
        query_start=torch.arange(len(seqs) + 1, dtype=torch.int32),
        seq_lens_cpu=[p + 1 for p in pos],
    )


@torch.inference_mode()
def test_decoder_padded_decode_matches_plain_forward() -> None:
    model = build_model(ARCH, TorchAttentionBackend(), torch.float32, "cpu")
    model.init_random(seed=1, std=0.3)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 96, (int(n),), generator=g).tolist() for n in (3, 9, 1, 14, 6, 4, 11)]
    plain_kv = allocate_kv_cache(ARCH, 1 + WIDTH * len(prompts), BLOCK, torch.float32, "cpu")
    padded_kv = allocate_kv_cache(ARCH, 1 + WIDTH * len(prompts), BLOCK, torch.float32, "cpu")
    first = _prefill(model, plain_kv, prompts)
    assert _prefill(model, padded_kv, prompts) == first
    runner = _runner(DecoderAdapter(model, padded_kv))
    plain = DecoderAdapter(model, plain_kv)
    lens, last = [len(p) for p in prompts], list(first)
    live = list(range(len(prompts)))
    for step in range(8):  # batch 7, 7, 6, 5, 4, 3, 2, 1: buckets 8, 8, 8, 8, 4, 4, 2, 1
        batch = _decode_batch(live, last, lens)
        plain.prepare_decode(batch)
        want = plain.forward_decode(batch)  # unpadded
        got = runner.run(batch)  # padded to its bucket
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        tokens = model.compute_logits(got).argmax(-1).tolist()
        assert tokens == model.compute_logits(want).argmax(-1).tolist()
        for s, t in zip(live, tokens, strict=True):
            last[s], lens[s] = t, lens[s] + 1
        if step >= 1:
            live.pop(step % len(live))
    assert runner.num_padded_eager == 8
    # padding rows wrote only to the dummy block: the two caches agree everywhere else
    for (pk, pv, _), (qk, qv, _) in zip(plain_kv, padded_kv, strict=True):
        torch.testing.assert_close(pk[1:], qk[1:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pv[1:], qv[1:], rtol=1e-5, atol=1e-5)
