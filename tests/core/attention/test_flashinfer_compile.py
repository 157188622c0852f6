"""FlashInferAttentionBackend under torch.compile, on the stand-in `flashinfer` module
(conftest.py): the model's decode forward traces with fullgraph=True (eager, aot_eager, Inductor)
with the same result and the same K/V written in place, and GraphRunner's decode compiles once for
every bucket above one (row dimension dynamic)."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from core_helpers.attention_steps import BS, HKV, HQ, D, Step
from core_helpers.attention_steps import backend as _backend
from rillet.core.attention.base import AttentionMetadata
from rillet.graphs.compile_modes import mark_batch_dynamic
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.static_buffers import StaticBuffers
from torch._inductor.utils import run_and_get_code

pytestmark = pytest.mark.isa  # run again under an AVX2 cap (tests/test_isa_cap.py)


def test_decode_forward_traces_fullgraph(fake_flashinfer: types.ModuleType) -> None:
    """The model's decode step around the op compiles with no graph break, same result, same K/V
    written to the cache."""
    from rillet.core.model.arch import ModelArch
    from rillet.core.model.decoder import allocate_kv_cache, build_model

    torch._dynamo.reset()
    arch = ModelArch(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=HQ,
        num_kv_heads=HKV,
        head_dim=D,
        max_position=64,
    )
    backend = _backend(graph_batch_sizes=(4,), max_blocks_per_seq=6)
    model = build_model(arch, backend, torch.float32, "cpu")
    model.init_random(seed=0, std=0.2)
    caches = allocate_kv_cache(arch, 41, BS, torch.float32, "cpu")
    step = Step([3, 9, 14, 1], [1, 1, 1, 1], seed=7)
    ids, pos = torch.tensor([5, 6, 7, 8]), step.meta.seq_lens.long() - 1

    def decode(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return model(ids, pos, caches, step.meta)

    backend.begin_step(step.meta)
    before = [c.clone() for kv in caches for c in kv[:2]]
    with torch.inference_mode():
        want = decode(ids, pos)
        written = [c.clone() for kv in caches for c in kv[:2]]
        for compiler in ("eager", "aot_eager", "inductor"):  # dynamo, the op's fake impl, Inductor
            for c, b in zip((c for kv in caches for c in kv[:2]), before, strict=True):
                c.copy_(b)
            fn = torch.compile(decode, fullgraph=True, dynamic=False, backend=compiler)
            if compiler == "inductor":
                got, code = run_and_get_code(fn, ids, pos)
                # the op writes K/V in place: no buffer of the cache's size (41 blocks) is ever
                # allocated, the cache is never copied (a write traced into the graph was
                # re-inplaced on CPU but copied whole on CUDA: core/attention/flashinfer_op.py)
                assert "flashinfer_attention" in code[0] and "empty_strided_cpu((41," not in code[0]
            else:
                got = fn(ids, pos)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            _assert_wrote_step_kv(caches, before, written, step.meta.slot_mapping)
    torch._dynamo.reset()


def _assert_wrote_step_kv(
    caches: Any, before: list[torch.Tensor], eager: list[torch.Tensor], slots: torch.Tensor
) -> None:
    """The compiled step wrote this step's K/V in place: the step's slots hold eager's values up to
    float32 rounding (a compiled projection may sum in another order, or with other vector widths,
    than eager's on this CPU: AVX2 and AVX-512 differ in the last bits), and every other slot is
    untouched, bit for bit."""
    for c, b, e in zip((c for kv in caches for c in kv[:2]), before, eager, strict=True):
        flat, flat_before, flat_eager = (t.flatten(0, 1) for t in (c, b, e))  # [blocks * BS, HKV, D]
        torch.testing.assert_close(flat[slots], flat_eager[slots], rtol=1e-5, atol=1e-5)
        assert not torch.equal(flat[slots], flat_before[slots])  # written, not left as before
        others = torch.ones(len(flat), dtype=torch.bool)
        others[slots] = False
        assert torch.equal(flat[others], flat_before[others])


class Decoder:
    """graphs' DecodeModel over DecoderModel, as the model runner adapts it (metadata built in
    prepare_decode, reused by the forward)."""

    def __init__(self, model: Any, caches: Any) -> None:
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
            BS,
            0,
        )
        self.model.backend.begin_step(self.meta)

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        return self.model(batch.input_ids, batch.positions, self.caches, self.meta)


def test_decode_compiles_once_for_every_bucket_above_one(fake_flashinfer: types.ModuleType) -> None:
    """GraphRunner's compile contract: row dimension dynamic, no recompile from bucket to bucket."""
    from rillet.core.model.arch import ModelArch
    from rillet.core.model.decoder import allocate_kv_cache, build_model

    torch._dynamo.reset()
    arch = ModelArch(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=HQ,
        num_kv_heads=HKV,
        head_dim=D,
        max_position=64,
    )
    model = build_model(
        arch, _backend(graph_batch_sizes=(2, 3, 4), max_blocks_per_seq=6), torch.float32, "cpu"
    )
    model.init_random(seed=0, std=0.2)
    decoder = Decoder(model, allocate_kv_cache(arch, 41, BS, torch.float32, "cpu"))
    static = StaticBuffers.allocate(4, 6, torch.device("cpu"))
    compiled = torch.compile(decoder.forward_decode, fullgraph=True, backend="eager")
    with torch.inference_mode():
        for i, n in enumerate((4, 3, 2)):
            step = Step([2 + 5 * j for j in range(n)], [1] * n, seed=n)
            m = step.meta
            batch = DecodeBatch(
                torch.arange(1, n + 1),
                m.seq_lens.long() - 1,
                m.slot_mapping,
                m.seq_lens,
                m.block_tables,
                m.query_start,
                m.seq_lens_cpu,
            )
            view = static.fill(batch, n)
            decoder.prepare_decode(view)
            mark_batch_dynamic(view)
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                got = compiled(view)
            torch.testing.assert_close(got, decoder.forward_decode(view), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
