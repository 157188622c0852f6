"""scheduler.policy priority end to end on a tiny random model, driven step by step through
`EngineCore`: a high-priority request arriving while low-priority choices (n = 2) hold every
batch place takes one's place; the displaced choice resumes once it is done and completes with the
same greedy tokens as the request alone (synchronous steps and overlapped ones, where it is
preempted with a token in flight)."""

from __future__ import annotations

import itertools

import pytest
from rillet.core.config import config_from_dict
from rillet.core.engine.core import EngineCore
from rillet.core.errors import RequestError
from rillet.core.llm import LLM
from rillet.core.runtime import Runtime, load_runtime
from rillet.core.sampling_params import SamplingParams as P
from rillet.core.sequence import FinishReason, Seq

TINY = {"kind": "shape", "shape": "tiny", "device": "cpu", "dtype": "float32", "quantization": "none"}
GREEDY = P(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    cfg = config_from_dict(
        {
            "model": TINY,
            "graphs": {"compile_mode": "none"},
            "cache": {"num_blocks": 16, "block_size": 8},
            "scheduler": {"max_num_seqs": 2, "max_num_batched_tokens": 32, "policy": "priority"},
        }
    )
    return load_runtime(cfg)


def request(ids: itertools.count[int], rid: str, prompt: list[int], n: int, priority: int) -> list[Seq]:
    seqs = [Seq(next(ids), rid, list(prompt), GREEDY, index=i) for i in range(n)]
    for seq in seqs:
        seq.leader, seq.priority = (seqs[0] if seq.index else None), priority
    return seqs


def drive(
    core: EngineCore, arrivals: dict[int, list[Seq]]
) -> tuple[dict[tuple[str, int], list[int]], list[str]]:
    """Steps until done, adding arrivals[k] before step k; each choice's tokens and finish order."""
    tokens: dict[tuple[str, int], list[int]] = {}
    finished: list[str] = []
    for step in range(200):
        if step in arrivals:
            core.add(arrivals[step])
        elif not core.has_work() and step > max(arrivals):
            break
        out = core.step()
        for d in out.deltas if out else []:
            tokens.setdefault((d.request_id, d.index), []).extend(d.token_ids)
            if d.finish_reason is not None:
                assert d.finish_reason is FinishReason.LENGTH, d
                finished.append(f"{d.request_id}/{d.index}")
    assert not core.has_work(), "the engine stalled"
    blocks = core.blocks
    blocks.check_integrity()
    assert blocks.num_used == 0
    return tokens, finished


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_a_displaced_low_priority_choice_completes_with_its_tokens_alone(
    runtime: Runtime, overlap: bool
) -> None:
    ids = itertools.count()
    low_prompt, high_prompt = [5, 9, 14, 3, 27, 8, 11], [40, 41, 7, 19]

    def core() -> EngineCore:
        return EngineCore(
            runtime.scheduler, runtime.runner, runtime.make_detokenizer, runtime.max_model_len, overlap
        )

    runtime.scheduler.blocks.reset_prefix_cache()
    alone, _ = drive(core(), {0: request(ids, "low", low_prompt, 1, 5)})
    runtime.scheduler.blocks.reset_prefix_cache()
    preempted_before = runtime.scheduler.preemptions
    low = request(ids, "low", low_prompt, 2, 5)
    high = request(ids, "high", high_prompt, 1, -1)
    got, finished = drive(core(), {0: low, 4: high})
    assert runtime.scheduler.preemptions - preempted_before == 1
    assert [s.num_preemptions for s in low] == [0, 1]  # the latest arrival of the worst priority
    assert finished.index("high/0") < finished.index("low/1")  # it ran in low/1's place
    assert got[("low", 0)] == got[("low", 1)] == alone[("low", 0)]
    assert len(got[("high", 0)]) == GREEDY.max_tokens


def test_the_engine_refuses_a_priority_under_fcfs_naming_it() -> None:
    """As vLLM: under fcfs a priority other than 0 is refused before anything is queued; and a
    priority that is not an integer under either policy."""
    cfg = config_from_dict({"model": TINY, "graphs": {"compile_mode": "none"}, "cache": {"num_blocks": 16}})
    with LLM(cfg) as llm:
        for bad in (1, True, 1.0):
            with pytest.raises(RequestError) as err:
                llm.generate([[5, 9, 14]], GREEDY, priority=bad)  # type: ignore[arg-type]
            assert err.value.param == "priority"
        assert llm.engine.core.num_waiting == 0
        out = llm.generate([[5, 9, 14]], P(max_tokens=2, temperature=0.0), priority=0)
        assert len(out[0].outputs[0].token_ids) == 2
