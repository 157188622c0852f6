"""The decode step compiled by torch.compile on CPU (graphs/compiled.py), in the whole engine.

Each model is compiled once (a module fixture; compiles dominate this file's time): the compiled
step gives the same greedy tokens as the eager path of the same engine, in float32, for batches of
1, 3, 8 and 17 rows (17 is above the largest bucket, 8: those steps run eager), while the pool is
small enough to preempt and the token budget small enough to chunk prompts. No graph break
(fullgraph=True raises on one), and no compile after the first two graphs (rows >= 2, rows == 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from rillet.core.attention.torch_backend import TorchAttentionBackend
from rillet.core.config import GraphConfig, config_from_dict
from rillet.core.llm import LLM
from rillet.core.model import allocate_kv_cache, build_model
from rillet.core.model.shapes import shape_arch
from rillet.core.model_runner import DecoderGraphAdapter, ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner
from torch._dynamo.utils import counters

pytestmark = pytest.mark.compiled

BATCHES = (1, 3, 8, 17)
BUCKETS = [1, 2, 4, 8]
PROMPTS = [[(7 * i + 3 * k) % 250 + 1 for k in range(2 + (5 * i) % 13)] for i in range(17)]


def _graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


@dataclass
class Compiled:
    llm: LLM
    runner: ModelRunner
    graphs: GraphRunner
    compiles: int  # graphs dynamo built while the engine started


def _compiled_llm(model: dict[str, Any], buckets: list[int] = BUCKETS, **sections: Any) -> Iterator[Compiled]:
    before = _graphs()
    cfg = config_from_dict(
        {
            "model": {**model, "dtype": "float32", "device": "cpu"},
            "graphs": {"enabled": "on", "buckets": buckets},
            "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 40},  # chunks prompts
            **sections,
        }
    )
    llm = LLM(cfg)
    try:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        gr = runner.graph_runner
        assert gr.mode == "compiled" and gr.compiled is not None
        assert gr.compiled.wait(timeout=900), "compile did not finish"
        assert gr.compiled.failed is None, gr.compiled.failed  # a graph break would be this error
        assert gr.compiled.ready and gr.compiled.ready_1 == (buckets[0] == 1)
        yield Compiled(llm, runner, gr, _graphs() - before)
    finally:
        llm.close()


def _generate(c: Compiled, n: int, compiled: bool) -> list[list[int]]:
    assert c.graphs.compiled is not None
    c.graphs.compiled.ready = compiled  # off: every decode step takes the model runner's eager path
    try:
        params = [SamplingParams(max_tokens=6 + i % 5, temperature=0.0, ignore_eos=True) for i in range(n)]
        return [o.outputs[0].token_ids for o in c.llm.generate(PROMPTS[:n], params)]
    finally:
        c.graphs.compiled.ready = True


@pytest.fixture(scope="module", params=["llama", "mistral", "qwen2"])
def tiny(request: pytest.FixtureRequest, tiny_hf_model: Any) -> Iterator[Compiled]:
    folder, _ = tiny_hf_model(request.param)
    # 20 blocks of 8 tokens: 17 sequences of up to 24 tokens do not fit at once, so some are preempted
    yield from _compiled_llm({"path": str(folder), "kind": "hf"}, cache={"num_blocks": 20, "block_size": 8})


def _spy_on_steps(c: Compiled) -> list[int]:
    """Row counts of the steps that took the compiled path."""
    assert c.graphs.compiled is not None
    rows: list[int] = []
    fn = c.graphs.compiled.fn

    def spy(batch: DecodeBatch) -> torch.Tensor:
        rows.append(batch.num_rows)
        return fn(batch)

    c.graphs.compiled.fn = spy
    return rows


def test_compiled_matches_eager_on_tiny_models(tiny: Compiled) -> None:
    preempted: list[int] = []
    scheduler = tiny.llm.engine.core.scheduler
    preempt = scheduler._preempt

    def spy_preempt(seq: Any) -> None:
        preempted.append(seq.seq_id)
        preempt(seq)

    scheduler._preempt = spy_preempt  # type: ignore[method-assign]
    rows = _spy_on_steps(tiny)
    graphs = _graphs()
    for n in BATCHES:
        assert _generate(tiny, n, compiled=True) == _generate(tiny, n, compiled=False), n
    assert _graphs() == graphs  # every bucket visited, nothing compiled again
    assert tiny.compiles == 2  # rows >= 2 (one dynamic graph) and rows == 1
    assert 1 in rows and max(rows) <= 8 and any(r not in BUCKETS for r in rows)  # exact sizes, no padding
    assert preempted, "the pool was meant to preempt"
    tiny.llm.engine.core.blocks.check_integrity()


def test_padded_to_buckets_matches_eager(tiny: Compiled) -> None:
    """The compiled step padded to its bucket, as a CUDA graph replay is (rows [b, bucket) dummy)."""
    tiny.graphs.pad_to_buckets = True
    try:
        rows = _spy_on_steps(tiny)
        for n in (3, 8):
            assert _generate(tiny, n, compiled=True) == _generate(tiny, n, compiled=False), n
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
    _generate(tiny, 8, compiled=True)
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

    want = _generate(tiny, 8, compiled=False)
    tiny.graphs.compiled.fn = overwriting
    assert _generate(tiny, 8, compiled=True) == want


@pytest.fixture(scope="module")
def default_model() -> Iterator[Compiled]:
    # buckets from 2: one compile for this 30-layer model (batch 1 runs as 2 rows of that graph)
    yield from _compiled_llm({}, buckets=[2, 4, 8], cache={"num_blocks": 64, "block_size": 16})


def test_compiled_matches_eager_on_the_default_model(default_model: Compiled) -> None:
    rows = _spy_on_steps(default_model)
    for n in BATCHES:
        assert _generate(default_model, n, compiled=True) == _generate(default_model, n, compiled=False), n
    assert default_model.compiles == 1
    assert 2 in rows and 1 not in rows  # batch 1 ran as 2 rows


def test_int4_weights_go_through_the_graph() -> None:
    """int4 / int8 weight-only matmuls (extern kernels) inside the fullgraph compile, no break."""
    arch = shape_arch("tiny")
    model = build_model(arch, TorchAttentionBackend(), torch.bfloat16, "cpu")
    model.init_random(seed=3, std=0.05)
    model.quantize_int4()
    kv = allocate_kv_cache(arch, 16, 8, torch.bfloat16, "cpu")
    adapter = DecoderGraphAdapter(model, kv, 8)
    gr = GraphRunner(
        adapter,
        GraphConfig(enabled="on", buckets=(2, 4)),
        max_num_seqs=4,
        max_blocks_per_seq=4,
        device="cpu",
    )
    before = _graphs()
    gr.start_compile(background=False)
    assert gr.compiled is not None and gr.compiled.failed is None and gr.compiled.ready
    assert _graphs() - before == 1
    batch = DecodeBatch(
        input_ids=torch.tensor([5, 9, 17]),
        positions=torch.tensor([0, 3, 7]),
        slot_mapping=torch.tensor([8, 16 + 3, 24 + 7]),
        seq_lens=torch.tensor([1, 4, 8], dtype=torch.int32),
        block_tables=torch.tensor([[1, 0], [2, 0], [3, 0]], dtype=torch.int32),
        query_start=torch.arange(4, dtype=torch.int32),
        seq_lens_cpu=[1, 4, 8],
    )
    got = gr.run(batch)
    assert gr.num_replays == 1
    want = adapter.forward_decode(batch)  # eager, same inputs (writes the same K/V again)
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)
    assert _graphs() == before + 1


def test_compile_cache_is_kept_per_isa_cap(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process capped to AVX2 (ATEN_CPU_CAPABILITY) and one without the cap must not share
    Inductor's cache: its key leaves the cap out, and the uncapped process crashed in the AVX2
    entry (tests/core/test_numerics.py runs both, in that order or the other)."""
    from rillet.graphs.compiled import set_compile_cache_dir
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


class _Clock:
    """A stand-in for time.perf_counter that only the fake steps below advance."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _FakeModel:
    def __init__(self, clock: _Clock, ms: float) -> None:
        self.clock, self.ms = clock, ms

    def prepare_decode(self, batch: DecodeBatch) -> None:
        pass

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        self.clock.now += self.ms / 1e3
        return torch.zeros(batch.num_rows, 4)


@pytest.mark.parametrize(("compiled_ms", "kept"), [(5.0, True), (10.5, True), (12.0, False)])
def test_auto_keeps_the_compiled_step_unless_clearly_slower(
    compiled_ms: float, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`graphs.enabled: auto` compares medians of interleaved calls and keeps the compiled step
    unless it is more than SLOWER_THAN_EAGER x eager: a check that runs beside a busy engine must
    not flip to eager on noise. A fake clock: no real timing."""
    from rillet.graphs import compiled as compiled_mod

    clock = _Clock()
    monkeypatch.setattr(compiled_mod.time, "perf_counter", clock)
    eager = _FakeModel(clock, 10.0)
    cd = compiled_mod.CompiledDecode(
        eager, "none", max_blocks_per_seq=4, device=torch.device("cpu"), check_faster=True, with_batch_1=False
    )
    cd.fn = _FakeModel(clock, compiled_ms).forward_decode
    assert cd._faster(cd._warm.padding(2, 3)) is kept
    assert (cd.failed is None) is kept
    if not kept:
        assert "slower" in (cd.failed or "")


def test_compile_thread_runs_at_a_lower_priority() -> None:
    """The compile thread nices itself (Linux: per thread), so the steps that serve meanwhile
    are not slowed by a cold compile; the engine's own threads keep their priority."""
    import os
    import threading

    from rillet.graphs.compiled import COMPILE_NICE, _lower_this_threads_priority

    if not hasattr(os, "setpriority"):
        pytest.skip("no per-thread priorities here")
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: list[int] = []

    def body() -> None:
        _lower_this_threads_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [min(19, mine + COMPILE_NICE)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


class _BlockingModel:
    """A model whose first forward blocks until released: a compile in flight."""

    def __init__(self) -> None:
        import threading

        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0

    def prepare_decode(self, batch: DecodeBatch) -> None:
        pass

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(30)
        return torch.zeros(batch.num_rows, 4)


def test_closing_mid_compile_waits_for_it_and_compiles_nothing_more() -> None:
    """The compile thread is not a daemon even when a daemon (the engine thread) starts it, so
    interpreter exit waits for it instead of cutting Inductor off (measured: exit status 134,
    "terminate called without an active exception"); stop() ends it after the phase in flight."""
    import threading

    from rillet.graphs.compiled import CompiledDecode

    model = _BlockingModel()
    cd = CompiledDecode(
        model, "none", max_blocks_per_seq=4, device=torch.device("cpu"), check_faster=True, with_batch_1=True
    )
    starter = threading.Thread(target=cd.start, daemon=True)  # as the engine thread does
    starter.start()
    starter.join()
    assert model.entered.wait(30)
    assert cd._thread is not None and not cd._thread.daemon
    cd.stop()
    model.release.set()
    assert cd.wait(30)
    # the phase in flight finished; neither the speed check nor the batch-1 graph ran
    assert model.calls == 1 and not cd.ready and not cd.ready_1
