"""An engine whose decode step torch.compile builds on CPU, for the compiled-step tests of
tests/graphs (test_compiled_decode.py: tiny models; test_compiled_default_model.py: the default
model): built, its compile waited for, and generation with that step on or off."""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from rillet.core.config import config_from_dict
from rillet.core.llm import LLM
from rillet.core.loaders import gguf
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.sampling_params import SamplingParams
from rillet.graphs.interface import DecodeBatch
from rillet.graphs.runner import GraphRunner
from torch._dynamo.utils import counters

BATCHES = (1, 3, 8, 17)
BUCKETS = [1, 2, 4, 8]
PROMPTS = [[(7 * i + 3 * k) % 250 + 1 for k in range(2 + (5 * i) % 13)] for i in range(17)]


def graphs() -> int:
    """Graphs dynamo has built in this process so far: a recompile shows as one more."""
    return int(counters["stats"]["unique_graphs"])


def settled_graphs() -> int:
    """graphs(), once no earlier engine's compile is still running: an engine closed before its
    compile finished (a test that only checks its config) leaves the compile thread to end its
    phase, and a graph it lands later would count as this engine's. Which module ran before this
    one on a pytest-xdist worker depends on timing, so without the wait the count did too."""
    for t in threading.enumerate():
        if t.name == "rillet-compile" and t is not threading.current_thread():
            t.join(timeout=900)
    return graphs()


@dataclass
class Compiled:
    llm: LLM
    runner: ModelRunner
    graphs: GraphRunner
    compiles: int  # graphs dynamo built while the engine started


def compiled_llm(
    model: dict[str, Any], buckets: list[int] = BUCKETS, layers: int | None = None, **sections: Any
) -> Iterator[Compiled]:
    """A float32 CPU engine over `model` (config keys) with its decode step compiled, yielded once
    the compile has finished without a graph break; a fixture's body (`yield from`). `layers`: a
    GGUF model's first `layers` decoder layers only (see first_layers)."""
    before = settled_graphs()
    cfg = config_from_dict(
        {
            "model": {"dtype": "float32", **model, "device": "cpu"},
            "graphs": {"enabled": "on", "buckets": buckets},
            "scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 40},  # chunks prompts
            **sections,
        }
    )
    with pytest.MonkeyPatch.context() as mp:  # the weights are loaded before LLM() returns
        if layers is not None:
            mp.setattr(gguf, "load_gguf", first_layers(gguf.load_gguf, layers))
        llm = LLM(cfg)
    try:
        runner = llm.engine.core.runner
        assert isinstance(runner, ModelRunner) and runner.graph_runner is not None
        gr = runner.graph_runner
        assert gr.mode == "compiled" and gr.compiled is not None
        assert gr.compiled.wait(timeout=900), "compile did not finish"
        assert gr.compiled.failed is None, gr.compiled.failed  # a graph break would be this error
        assert gr.compiled.ready and gr.compiled.ready_1 == (buckets[0] == 1)
        yield Compiled(llm, runner, gr, graphs() - before)
    finally:
        llm.close()


def first_layers(load: Any, layers: int) -> Any:
    """A load_gguf that keeps a model's first `layers` decoder layers: the same weights, shapes,
    quantization and kernels, but Inductor's lowering and code generation (most of a cold compile,
    which grows with the graph) over a fraction of the 30-layer default model's graph."""
    deeper = re.compile(r"model\.layers\.(\d+)\.")

    def load_first(*args: Any, **kwargs: Any) -> Any:
        arch, weights = load(*args, **kwargs)
        assert arch.num_layers >= layers
        kept = ((n, w) for n, w in weights if (m := deeper.match(n)) is None or int(m.group(1)) < layers)
        return dataclasses.replace(arch, num_layers=layers), kept

    return load_first


def generate(c: Compiled, n: int, compiled: bool) -> list[list[int]]:
    """Greedy tokens for the first `n` PROMPTS, every decode step compiled or every one eager."""
    assert c.graphs.compiled is not None
    c.graphs.compiled.ready = compiled  # off: every decode step takes the model runner's eager path
    try:
        params = [SamplingParams(max_tokens=6 + i % 5, temperature=0.0, ignore_eos=True) for i in range(n)]
        return [o.outputs[0].token_ids for o in c.llm.generate(PROMPTS[:n], params)]
    finally:
        c.graphs.compiled.ready = True


def spy_on_steps(c: Compiled) -> list[int]:
    """Row counts of the steps that took the compiled path."""
    assert c.graphs.compiled is not None
    rows: list[int] = []
    fn = c.graphs.compiled.fn

    def spy(batch: DecodeBatch) -> torch.Tensor:
        rows.append(batch.num_rows)
        return fn(batch)

    c.graphs.compiled.fn = spy
    return rows
