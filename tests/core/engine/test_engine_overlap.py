"""engine.overlap: the pipelined step gives the same tokens as the synchronous one, token for token.

A mixed workload (greedy and seeded, n > 1, stop strings, EOS, max_tokens, min_tokens, logprobs,
a penalised request that forces synchronous steps, an abort mid-stream, staggered arrivals) runs on
a random tiny Llama with a pool small enough to preempt and shared prompt prefixes, driven step by
step through `EngineCore` with overlap off and on. The model's LM-head row for the EOS id copies
a frequent token's row (scaled up), so EOS is really generated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from drivers.workload import (
    EOS,
    WORKLOAD,
    Req,
    check_deltas,
    drive,
    pending_at_launch,
    prompt,
    save_eos_model,
)
from rillet.core.config import config_from_dict
from rillet.core.runtime import Runtime, load_runtime
from rillet.core.sampling_params import SamplingParams as P
from rillet.core.sequence import FinishReason


@pytest.fixture(scope="module")
def eos_model(tiny_hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _, hf = tiny_hf_model("llama", num_hidden_layers=2)
    return save_eos_model(hf, tmp_path_factory.mktemp("hf_llama_eos"))


@pytest.fixture(scope="module")
def runtime(eos_model: Path) -> Runtime:
    cfg = config_from_dict(
        {
            "model": {"path": str(eos_model), "kind": "hf", "dtype": "float32"},
            "cache": {"num_blocks": 22, "block_size": 8},
            "scheduler": {"max_num_seqs": 6, "max_num_batched_tokens": 24},
        }
    )
    return load_runtime(cfg)


@pytest.mark.parametrize("depth", [1, 2])
def test_overlap_on_and_off_give_the_same_tokens(
    runtime: Runtime, depth: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """depth: engine.overlap_depth, the steps in flight (2: a sequence holds up to two pending
    tokens, a preempted one up to two in flight, a stop or abort is seen two launches late)."""
    off = drive(runtime, overlap=False, workload=WORKLOAD)
    pending = pending_at_launch(runtime, monkeypatch)
    on = drive(runtime, overlap=True, workload=WORKLOAD, depth=depth)
    assert max(pending) == depth  # decodes fed from the future buffer with `depth` tokens unseen
    check_deltas(off, WORKLOAD)
    check_deltas(on, WORKLOAD)
    assert on.tokens() == off.tokens()
    assert on.finishes() == off.finishes()
    texts = {k: "".join(d.text for d in ds) for k, ds in on.deltas.items()}
    assert texts == {k: "".join(d.text for d in ds) for k, ds in off.deltas.items()}
    # logprobs: the same entries; values to float32 rounding (batches are composed differently)
    lp_on = [lp for d in on.deltas[("logprobs", 0)] for lp in d.logprobs or []]
    lp_off = [lp for d in off.deltas[("logprobs", 0)] for lp in d.logprobs or []]
    assert [(x.token_id, [t for t, _ in x.top]) for x in lp_on] == [
        (x.token_id, [t for t, _ in x.top]) for x in lp_off
    ]
    assert [x.logprob for x in lp_on] == pytest.approx([x.logprob for x in lp_off], abs=1e-4)

    # the workload exercised what it is meant to, in both modes
    tokens, finishes = on.tokens(), on.finishes()
    stops = [k for k, f in finishes.items() if f is FinishReason.STOP]
    assert any(tokens[k][-1] == EOS for k in stops), "no choice ended with EOS"
    assert any(tokens[k][-1] != EOS for k in stops), "no choice ended with a stop string"
    assert finishes[("greedy-long", 0)] is FinishReason.LENGTH
    assert finishes[("aborted", 0)] is FinishReason.ABORT and len(tokens[("aborted", 0)]) == 5
    assert len(tokens[("min-tokens", 0)]) >= 15
    assert len({tuple(tokens[("seeded-n3", i)]) for i in range(3)}) == 3  # seeds 11, 12, 13
    for run in (off, on):
        assert run.preemptions > 0, "the pool was meant to be too small for the whole workload"
        assert run.prefix_hit_tokens > 0, "shared prefixes were meant to hit the prefix cache"


@pytest.mark.parametrize("depth", [1, 2])
def test_a_sequence_stopped_at_step_n_never_shows_its_token_from_n_plus_1(
    runtime: Runtime, depth: int
) -> None:
    """With overlap, the `depth` steps after an EOS or a stop string are already launched when the
    host sees the stop: their tokens are dropped, never sent."""
    reqs = [Req("eos", prompt(9, 6), P(max_tokens=40, temperature=0.0, stop=("oo",)))]
    launched: list[int] = []
    runner = runtime.runner
    real_launch = runner.launch

    def counting_launch(batch: Any) -> Any:
        launched.extend(s.seq_id for s in batch.seqs)
        return real_launch(batch)

    runner.launch = counting_launch  # type: ignore[method-assign]
    try:
        on = drive(runtime, overlap=True, workload=reqs, depth=depth)
    finally:
        runner.launch = real_launch  # type: ignore[method-assign]
    tokens = on.tokens()[("eos", 0)]
    assert on.finishes()[("eos", 0)] is FinishReason.STOP
    # prefill + one launch per token after the first, + the extra launches that were discarded
    assert len(launched) == len(tokens) + depth
