"""The decode step compiled by torch.compile on CPU (graphs/compiled.py), in the whole engine, on
tiny models (the default model: test_compiled_default_model.py).

Each model is compiled once (a module fixture; compiles dominate this file's time): the compiled
step gives the same greedy tokens as the eager path of the same engine, in float32, for batches of
1, 3, 8 and 17 rows (17 is above the largest bucket, 8: those steps run eager), while the pool is
small enough to preempt and the token budget small enough to chunk prompts. No graph break
(fullgraph=True raises on one), and no compile after the first two graphs (rows >= 2, rows == 1).
One tiny model runs over an int8 KV pool (cache.dtype: the codes dequantized inside the step).
int4 weights compile in the tuned mode (frozen, autotuned) on a tiny shape model here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch
from harness.compiled_engine import BATCHES, BUCKETS, Compiled, compiled_llm, generate, graphs, spy_on_steps
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.config import CompileMode, GraphConfig
from rillet.core.model.decoder import allocate_kv_cache, build_model
from rillet.core.model.shapes import shape_arch
from rillet.core.quant import rows_kernel
from rillet.core.quant.int4 import Int4Weight
from rillet.core.runner.graph_adapter import DecoderGraphAdapter
from rillet.graphs.compile_modes import resolve_compile_mode
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner
from torch._dynamo.utils import counters

pytestmark = pytest.mark.compiled


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2", "llama+int8"])
def tiny(request: pytest.FixtureRequest, tiny_hf_model: Any) -> Iterator[Compiled]:
    """`+int8`: over an int8 KV pool (cache.dtype), dequantized inside the compiled step."""
    family, _, kv_dtype = str(request.param).partition("+")
    folder, _ = tiny_hf_model(family)
    # 20 blocks of 8 tokens: 17 sequences of up to 24 tokens do not fit at once, so some are preempted
    cache = {"num_blocks": 20, "block_size": 8, "dtype": kv_dtype or "auto"}
    yield from compiled_llm({"path": str(folder), "kind": "hf"}, cache=cache)


def test_compiled_matches_eager_on_tiny_models(tiny: Compiled) -> None:
    preempted: list[int] = []
    scheduler = tiny.llm.engine.core.scheduler
    preempt = scheduler._preempt

    def spy_preempt(seq: Any) -> None:
        preempted.append(seq.seq_id)
        preempt(seq)

    scheduler._preempt = spy_preempt  # type: ignore[method-assign]
    rows = spy_on_steps(tiny)
    compiled_before = graphs()
    for n in BATCHES:
        assert generate(tiny, n, compiled=True) == generate(tiny, n, compiled=False), n
    assert graphs() == compiled_before  # every bucket visited, nothing compiled again
    assert tiny.compiles == 2  # rows >= 2 (one dynamic graph) and rows == 1
    assert 1 in rows and max(rows) <= 8 and any(r not in BUCKETS for r in rows)  # exact sizes, no padding
    assert preempted, "the pool was meant to preempt"
    tiny.llm.engine.core.blocks.check_integrity()


def test_padded_to_buckets_matches_eager(tiny: Compiled) -> None:
    """The compiled step padded to its bucket, as a CUDA graph replay is (rows [b, bucket) dummy)."""
    tiny.graphs.pad_to_buckets = True
    try:
        rows = spy_on_steps(tiny)
        for n in (3, 8):
            assert generate(tiny, n, compiled=True) == generate(tiny, n, compiled=False), n
        assert set(rows) <= set(BUCKETS) and 4 in rows
    finally:
        tiny.graphs.pad_to_buckets = False


def test_static_buffers_keep_their_storage(tiny: Compiled) -> None:
    static = tiny.graphs.static
    assert static is not None
    fields = ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables")
    ptrs = {f: getattr(static, f).data_ptr() for f in fields}
    seen: list[dict[str, int]] = []
    assert tiny.graphs.compiled is not None
    fn = tiny.graphs.compiled.fn

    def spy(batch: DecodeBatch) -> torch.Tensor:
        seen.append({f: getattr(batch, f).data_ptr() for f in fields})
        return fn(batch)

    tiny.graphs.compiled.fn = spy
    generate(tiny, 8, compiled=True)
    assert len(seen) > 3 and all(s == ptrs for s in seen)
    assert {f: getattr(static, f).data_ptr() for f in fields} == ptrs


def test_output_is_consumed_before_the_next_step(tiny: Compiled) -> None:
    """Each step's output is overwritten (NaN) at the start of the next one, as a CUDA graph's
    output buffer is by the next replay: the tokens must not change."""
    assert tiny.graphs.compiled is not None
    fn = tiny.graphs.compiled.fn
    last: list[torch.Tensor] = []

    def overwriting(batch: DecodeBatch) -> torch.Tensor:
        if last:
            last.pop().fill_(float("nan"))
        out = fn(batch)
        last.append(out)
        return out

    want = generate(tiny, 8, compiled=False)
    tiny.graphs.compiled.fn = overwriting
    assert generate(tiny, 8, compiled=True) == want


def _int4_tiny(seed: int) -> tuple[DecoderGraphAdapter, GraphRunner]:
    # every projection's rows a multiple of 64: the int4 template takes them; one layer has each
    # projection once (qkv, o, gate_up, down), and a compile of two only repeated them
    arch = dataclasses.replace(shape_arch("tiny"), num_layers=1)
    model = build_model(arch, TorchAttentionBackend(), torch.float32, "cpu")
    model.init_random(seed=seed, std=0.05)
    model.quantize_int4()
    kv = allocate_kv_cache(arch, 16, 8, torch.float32, "cpu")
    adapter = DecoderGraphAdapter(model, kv, 8)
    mode, _ = resolve_compile_mode("auto", torch.device("cpu"), model.int4_weights)
    settings = GraphConfig(enabled="on", buckets=(2, 4), compile_mode=cast(CompileMode, mode))
    return adapter, GraphRunner(adapter, settings, max_num_seqs=4, max_blocks_per_seq=4, device="cpu")


@pytest.mark.parametrize("kernel", ["aten", "rillet"])
def test_int4_weights_go_through_the_graph_frozen_and_autotuned(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int4 weights on CPU compile in the tuned mode (auto): the weights frozen, fullgraph, no
    break. In torch's layout each int4 matmul is autotuned between aten's kernel (an extern kernel
    in the graph) and Inductor's int4 GEMM template (offered only for frozen weights); in rillet's
    (core/quant/rows_kernel.py, where it runs) each is its custom op, an extern kernel too.
    Inductor's cache is keyed by the weights (graphs/frozen.py): a second model of the same shapes
    with other weights compiles an entry of its own and computes with its own weights (on AMX the
    template packs the weights into the entry: sharing it computed with the first model's); the
    first model's weights again (a restart) hit the first entry and give the first answer."""
    from torch._inductor.utils import fresh_cache

    if kernel == "rillet" and not rows_kernel.preferred():
        pytest.skip("rillet's int4 kernel is used where the CPU has AVX512-BF16 and no AMX")
    monkeypatch.setenv(rows_kernel.KERNEL_ENV, "aten" if kernel == "aten" else "auto")

    assert resolve_compile_mode("auto", torch.device("cpu"), False)[0] == "default"
    assert resolve_compile_mode("auto", torch.device("cuda"), True)[0] == "default"
    batch = DecodeBatch(
        input_ids=torch.tensor([5, 9, 17]),
        positions=torch.tensor([0, 3, 7]),
        slot_mapping=torch.tensor([8, 16 + 3, 24 + 7]),
        seq_lens=torch.tensor([1, 4, 8], dtype=torch.int32),
        block_tables=torch.tensor([[1, 0], [2, 0], [3, 0]], dtype=torch.int32),
        query_start=torch.arange(4, dtype=torch.int32),
        seq_lens_cpu=[1, 4, 8],
    )
    outputs = []
    with fresh_cache():  # in-memory autotune results of earlier tests too
        for seed, cached in ((3, False), (4, False), (3, True)):
            adapter, gr = _int4_tiny(seed)
            assert gr.compile_mode == "max-autotune-no-cudagraphs"
            assert gr.compiled is not None and gr.compiled.freeze
            before, tuned, hits = graphs(), _count("select_algorithm_autotune"), _count("fxgraph_cache_hit")
            gr.start_compile(background=False)
            assert gr.compiled.failed is None and gr.compiled.ready
            assert graphs() - before == 1
            assert (_count("fxgraph_cache_hit") > hits) is cached, seed
            int4 = [m for m in adapter.model.modules() if isinstance(m, Int4Weight)]
            assert int4 and all(m.rows is (kernel == "rillet") for m in int4)
            if not outputs and _avx512() and kernel == "aten":  # qkv, o, gate_up, down: aten or template
                assert _count("select_algorithm_autotune") - tuned >= 4
            with torch.inference_mode():
                got = gr.run(batch).float()
                want = adapter.forward_decode(batch).float()  # eager, same inputs (same K/V written again)
            assert gr.num_replays == 1
            torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)
            outputs.append(got)
    assert not torch.allclose(outputs[0], outputs[1], atol=0.1)  # two models, two answers
    torch.testing.assert_close(outputs[2], outputs[0], rtol=0.02, atol=0.02)


def _avx512() -> bool:
    """Inductor's int4 GEMM template has AVX-512 and AMX micro-kernels only (both CPU models seen
    in CI have AVX-512); elsewhere aten's kernel is the one choice and nothing is autotuned."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _count(name: str) -> int:
    return int(counters["inductor"][name])


def test_compile_cache_is_kept_per_isa_cap(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process capped to AVX2 (ATEN_CPU_CAPABILITY) and one without the cap must not share
    Inductor's cache: its key leaves the cap out, and the uncapped process crashed in the AVX2
    entry (tests/core/test_numerics.py runs both, in that order or the other)."""
    from rillet.graphs.compile_modes import set_compile_cache_dir
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    where = {}
    for cap in ("avx2", None):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
        if cap is None:
            monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
        else:
            monkeypatch.setenv("ATEN_CPU_CAPABILITY", cap)
        where[cap] = set_compile_cache_dir(tmp_path)
        assert where[cap].is_dir() and where[cap].parent == tmp_path
    assert where["avx2"] != where[None]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert set_compile_cache_dir(tmp_path) == tmp_path / "mine"  # the user's choice wins
