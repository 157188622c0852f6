"""The invariant attention backend: a token's output has the same bits as a fresh prompt's row, as a
chunk's row after any number of cached tokens, and as a decode row among other rows with wider
block tables, in any position of its batch; with sliding windows and soft-capped scores too; and it
is attention (close to the plain formula)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from rillet.core.attention.base import AttentionMetadata, DecodeMetadata
from rillet.core.attention.invariant import InvariantAttentionBackend
from rillet.core.determinism.mkl import strict_in_force
from rillet.core.determinism.rows import RowPadding

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)

BS, NUM_BLOCKS = 16, 160
STRICT = strict_in_force()


@dataclass(frozen=True)
class Heads:
    hq: int
    hkv: int
    d: int


SMOLLM2 = Heads(9, 3, 64)
TINY = Heads(4, 2, 16)


@dataclass
class SeqData:
    q: torch.Tensor  # [S, Hq, D]
    k: torch.Tensor  # [S, Hkv, D]
    v: torch.Tensor
    blocks: list[int]


class World:
    """One KV pool and sequences with fixed per-token q/k/v, written as steps run them."""

    def __init__(self, heads: Heads, seed: int) -> None:
        self.h = heads
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)
        self.free = list(range(1, NUM_BLOCKS))
        self.rng.shuffle(self.free)
        shape = (NUM_BLOCKS, BS, heads.hkv, heads.d)
        # stale finite values everywhere, as a pool that served other requests holds
        self.k_cache = torch.randn(shape, generator=self.gen)
        self.v_cache = torch.randn(shape, generator=self.gen)

    def seq(self, s: int) -> SeqData:
        h, g = self.h, self.gen
        n = -(-s // BS)
        blocks, self.free = self.free[:n], self.free[n:]
        return SeqData(
            torch.randn(s, h.hq, h.d, generator=g),
            torch.randn(s, h.hkv, h.d, generator=g),
            torch.randn(s, h.hkv, h.d, generator=g),
            blocks,
        )

    def step(
        self,
        backend: InvariantAttentionBackend,
        work: list[tuple[SeqData, int, int]],  # (seq, tokens before, tokens this step); prefills first
        extra_width: int = 0,
        **opts: object,
    ) -> list[torch.Tensor]:  # per seq its [n, Hq, D] rows
        qs, ks, vs, slots, qlens, slens, tables = [], [], [], [], [], [], []
        for sd, before, n in work:
            qs.append(sd.q[before : before + n])
            ks.append(sd.k[before : before + n])
            vs.append(sd.v[before : before + n])
            slots += [sd.blocks[p // BS] * BS + p % BS for p in range(before, before + n)]
            qlens.append(n)
            slens.append(before + n)
            tables.append(sd.blocks[: -(-(before + n) // BS)])
        width = max(len(t) for t in tables) + extra_width
        bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        n_pre = sum(1 for sd, before, n in work if n > 1 or before == 0)
        meta = AttentionMetadata(
            torch.tensor(slots),
            torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32),
            torch.tensor(slens, dtype=torch.int32),
            bt,
            qlens,
            slens,
            BS,
            n_pre,
        )
        h = self.h
        out = backend.forward(
            torch.cat(qs), torch.cat(ks), torch.cat(vs), self.k_cache, self.v_cache, meta, h.d**-0.5, **opts
        )  # type: ignore[arg-type]
        return list(out.split(qlens))


def reference(sd: SeqData, window: int | None, softcap: float | None) -> torch.Tensor:
    s, hq, d = sd.q.shape
    g = hq // sd.k.shape[1]
    pos = torch.arange(s)
    mask = pos[None, :] <= pos[:, None]
    if window is not None:
        mask &= pos[None, :] > pos[:, None] - window
    qt = sd.q.transpose(0, 1).double()
    kt = sd.k.repeat_interleave(g, 1).transpose(0, 1).double()
    vt = sd.v.repeat_interleave(g, 1).transpose(0, 1).double()
    scores = qt @ kt.transpose(1, 2) * d**-0.5
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    return (torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ vt).transpose(0, 1).float()


OPTIONS = [
    pytest.param({}, id="causal"),
    pytest.param({"window": 40}, id="window"),
    pytest.param({"softcap": 5.0}, id="softcap"),
]


@pytest.mark.parametrize("heads", [SMOLLM2, TINY], ids=["smollm2", "tiny"])
@pytest.mark.parametrize("opts", OPTIONS)
def test_every_path_gives_a_token_the_same_bits(heads: Heads, opts: dict[str, object]) -> None:
    backend = InvariantAttentionBackend(RowPadding(STRICT))
    world = World(heads, seed=hash((heads.hq, tuple(opts))) % 1000)
    window, softcap = opts.get("window"), opts.get("softcap")
    for s in (1, 5, 17, 64, 65, 150):
        sd = world.seq(s)
        other = world.seq(37)
        full = world.step(backend, [(other, 0, 37), (sd, 0, s)], **opts)[1]  # fresh prompt
        ref = reference(sd, window, softcap)  # type: ignore[arg-type]
        assert torch.allclose(full, ref, atol=2e-5, rtol=1e-4), (full - ref).abs().max()
        # chunks after cached tokens (a prefix hit, a recomputation, chunked prefill)
        for c in sorted({1, s // 3, s // 2, s - 1, s - 16}):
            if not 0 < c < s:
                continue
            for n in sorted({s - c, min(s - c, 7)}):
                rows = world.step(backend, [(sd, c, n), (other, 36, 1)], **opts)[0]
                assert torch.equal(rows, full[c : c + n]), (s, c, n)
        # a decode row among others, anywhere in the batch, the table wider than it needs
        for p in range(max(0, s - 3), s):
            mates = [world.seq(world.rng.randint(1, 90)) for _ in range(world.rng.choice([0, 3, 15]))]
            work = [(m, len(m.q) - 1, 1) for m in mates]
            at = world.rng.randint(0, len(work))
            work.insert(at, (sd, p, 1))
            if p == 0:  # a one-token prompt is a prefill row: it goes first
                work.insert(0, work.pop(at))
                at = 0
            rows = world.step(backend, work, extra_width=world.rng.randint(0, 3), **opts)
            assert torch.equal(rows[at][0], full[p]), (s, p, len(work))
            world.free += [b for m in mates for b in m.blocks]
        world.free += sd.blocks + other.blocks


def test_the_graph_safe_decode_interface_agrees() -> None:
    backend = InvariantAttentionBackend(RowPadding(STRICT))
    world = World(SMOLLM2, seed=3)
    sd, mate = world.seq(70), world.seq(20)
    full = world.step(backend, [(sd, 0, 70)])[0]
    world.step(backend, [(mate, 0, 20)])
    slots = torch.tensor([sd.blocks[69 // BS] * BS + 69 % BS, mate.blocks[19 // BS] * BS + 19 % BS])
    width = 8  # wider than either context, as a full-width table
    bt = torch.tensor([b + [0] * (width - len(b)) for b in (sd.blocks, mate.blocks)], dtype=torch.int32)
    meta = DecodeMetadata(slots, torch.tensor([70, 20], dtype=torch.int32), bt)
    q = torch.stack([sd.q[69], mate.q[19]])
    k, v = torch.stack([sd.k[69], mate.k[19]]), torch.stack([sd.v[69], mate.v[19]])
    out = backend.forward(q, k, v, world.k_cache, world.v_cache, meta, SMOLLM2.d**-0.5)
    assert torch.equal(out[0], full[69])
