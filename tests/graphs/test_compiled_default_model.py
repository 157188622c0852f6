"""The default model as served (int4 weights, float32 activations) with its decode step compiled
in the tuned mode (`compile_mode: auto` on CPU with int4 weights), in the whole engine: the
compiled step's greedy tokens equal the eager step's for batches of 1, 3, 8 and 17 rows, one
compile in all. Apart from test_compiled_decode.py (tiny models): this compile is the suite's
longest, and a module of its own lets the other worker run the tiny models' compiles meanwhile.

The model's first LAYERS of its 30 decoder layers: every weight shape, the int4 packing, the
autotuned GEMM templates and the LM head are the served model's, while a cold compile (Inductor's
lowering and code generation, ~2 minutes for all 30 layers, most of it growing with the layers)
takes a fraction of that (harness/compiled_engine.py first_layers).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.compiled_engine import BATCHES, PROMPTS, Compiled, compiled_llm, generate, spy_on_steps
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import TokenLogprob

pytestmark = pytest.mark.compiled

LAYERS = 4
NEAR_TIE = 0.05  # nats: see test_compiled_matches_eager_on_the_default_model


@pytest.fixture(scope="module")
def default_model() -> Iterator[Compiled]:
    # as served by default: int4 weights, float32 activations. Buckets from 2: one compile (batch 1
    # runs as 2 rows of that graph)
    model = {"dtype": "auto"}
    cache = {"num_blocks": 64, "block_size": 16}
    yield from compiled_llm(model, buckets=[2, 4, 8], layers=LAYERS, cache=cache)


def test_compiled_matches_eager_on_the_default_model(default_model: Compiled) -> None:
    """The default model compiles in the tuned mode (int4 weights on CPU: `compile_mode: auto`).
    Its int4 GEMM template computes as aten's kernel does on AVX-512 (float32 dequantization and
    accumulation: the same tokens here), but on AMX machines Inductor may pick its AMX micro-kernel,
    which rounds the dequantized weights to bf16: there a greedy choice may flip where eager's two
    best tokens are within NEAR_TIE nats, and only there."""
    gr = default_model.graphs
    assert gr.compile_mode == "max-autotune-no-cudagraphs" and gr.compiled is not None and gr.compiled.freeze
    rows = spy_on_steps(default_model)
    for n in BATCHES:
        got = generate(default_model, n, compiled=True)
        want, logprobs = _generate_eager_with_logprobs(default_model, n)
        for g, w, lps in zip(got, want, logprobs, strict=True):
            if g != w:
                i = next(k for k, (a, b) in enumerate(zip(g, w, strict=False)) if a != b)
                top = dict(lps[i].top)
                assert g[i] in top and top[w[i]] - top[g[i]] <= NEAR_TIE, (n, i, g, w, lps[i])
    assert default_model.compiles == 1
    assert default_model.runner.model.arch.num_layers == LAYERS
    assert 2 in rows and 1 not in rows  # batch 1 ran as 2 rows


def _generate_eager_with_logprobs(c: Compiled, n: int) -> tuple[list[list[int]], list[list[TokenLogprob]]]:
    assert c.graphs.compiled is not None
    c.graphs.compiled.ready = False
    try:
        params = [
            SamplingParams(max_tokens=6 + i % 5, temperature=0.0, ignore_eos=True, logprobs=3)
            for i in range(n)
        ]
        outs = [o.outputs[0] for o in c.llm.generate(PROMPTS[:n], params)]
    finally:
        c.graphs.compiled.ready = True
    assert all(o.logprobs is not None for o in outs)
    return [o.token_ids for o in outs], [o.logprobs or [] for o in outs]
