"""A verify step's head and sampling in rounds (core/runner/verify_rounds.py): the rows a run
needs are computed, the rows past its first refused draft token are not, and every emitted token
is the one sampling all rows at once gives."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from rillet.core.model.decoder import DecoderModel
from rillet.core.runner.sampler import Sampler
from rillet.core.runner.verify_rounds import ALL, NOT_COMPUTED, ROUND, round_rows, sample_in_rounds
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.spec.views import accepted_run, position_views
from rillet.core.structured.masks import MaskStats, PendingMask

VOCAB, HIDDEN = 50, 8
CPU = torch.device("cpu")


def seq(i: int, **params: Any) -> Seq:
    s = Seq(i, f"r{i}", [1, 2, 3], SamplingParams(**{"max_tokens": 64, **params}))
    s.output_ids = [4]
    s.num_computed = s.num_tokens - 1
    return s


def test_rows_past_the_first_refusal_are_never_computed_and_the_rest_sample_as_one_batch() -> None:
    torch.manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN)
    # (draft length, draft tokens kept); one sequence of random rows, seeded, with logprobs
    plan = [(6, 1), (5, 5), (0, 0), (4, 4), (7, 5)]
    owners_by_seq = [seq(i, temperature=0.0) for i in range(len(plan))]
    owners_by_seq[2] = seq(2, temperature=0.9, seed=5, logprobs=2)
    owners = [s for s, (k, _) in zip(owners_by_seq, plan, strict=True) for _ in range(k + 1)]
    offsets = [j for k, _ in plan for j in range(k + 1)]
    hidden = torch.randn(len(owners), HIDDEN)
    hidden[:, 0] = torch.arange(len(owners), dtype=torch.float32)  # a row's id, read back below
    everything = hidden @ weight.t()  # [S, V]
    want = everything.argmax(-1).tolist()
    start = 0
    for s, (k, kept) in zip(owners_by_seq, plan, strict=True):  # drafts that keep `kept` tokens
        s.draft_ids = [want[start + j] if j < kept else (want[start + j] + 1) % VOCAB for j in range(k)]
        start += k + 1
    views = position_views(owners, offsets)
    reference = Sampler(VOCAB, (), CPU, seed=1).sample(everything, views)

    computed: list[list[int]] = []

    def logits_of(rows: torch.Tensor) -> torch.Tensor:
        computed.append([int(r) for r in rows[:, 0].tolist()])
        return rows @ weight.t()

    result, tokens = sample_in_rounds(
        logits_of, Sampler(VOCAB, (), CPU, seed=2), hidden, views, owners, offsets, None, ROUND
    )

    assert tokens.tolist() == result.token_ids
    start = 0
    for s, (k, kept) in zip(owners_by_seq, plan, strict=True):
        got = result.token_ids[start : start + k + 1]
        assert accepted_run(s.draft_ids, got) == kept
        # the kept drafts and the token after them: as sampled all at once (logprobs too)
        assert got[: kept + 1] == reference.token_ids[start : start + kept + 1]
        for j in range(kept + 1):
            assert result.logprobs[start + j] == reference.logprobs[start + j]
        # computed: the rounds up to the one holding the refusal (or the last position)
        last_round = min(kept, k) // ROUND
        needed = min(k + 1, (last_round + 1) * ROUND)
        assert all(t != NOT_COMPUTED for t in got[:needed])
        assert got[needed:] == [NOT_COMPUTED] * (k + 1 - needed)
        assert all(result.logprobs[start + j] is None for j in range(needed, k + 1))
        start += k + 1
    flat = [r for rnd in computed for r in rnd]
    assert sorted(flat) == [i for i, t in enumerate(result.token_ids) if t != NOT_COMPUTED]
    assert len(computed) == 2  # (5, 5) and (7, 5) went on to a second round, nobody to a third


def test_a_run_that_fits_one_round_is_one_head_call() -> None:
    s = seq(0, temperature=0.0)
    s.draft_ids = [7] * (ROUND - 1)
    owners, offsets = [s] * ROUND, list(range(ROUND))
    calls: list[int] = []

    def logits_of(rows: torch.Tensor) -> torch.Tensor:
        calls.append(len(rows))
        return torch.zeros(len(rows), VOCAB).index_fill_(1, torch.tensor([7]), 1.0)

    views = position_views(owners, offsets)
    result, _ = sample_in_rounds(
        logits_of, Sampler(VOCAB, (), CPU), torch.zeros(ROUND, HIDDEN), views, owners, offsets, None, ROUND
    )
    assert calls == [ROUND] and result.token_ids == [7] * ROUND


def test_one_round_computes_every_row_in_one_call_and_emits_the_same_tokens() -> None:
    torch.manual_seed(0)
    weight = torch.randn(VOCAB, HIDDEN)
    plan = [(9, 5), (2, 0), (0, 0)]  # (draft length, draft tokens kept)
    owners_by_seq = [seq(i, temperature=0.0) for i in range(len(plan))]
    owners = [s for s, (k, _) in zip(owners_by_seq, plan, strict=True) for _ in range(k + 1)]
    offsets = [j for k, _ in plan for j in range(k + 1)]
    hidden = torch.randn(len(owners), HIDDEN)
    want = (hidden @ weight.t()).argmax(-1).tolist()
    start = 0
    for s, (k, kept) in zip(owners_by_seq, plan, strict=True):
        s.draft_ids = [want[start + j] if j < kept else (want[start + j] + 1) % VOCAB for j in range(k)]
        start += k + 1
    views = position_views(owners, offsets)
    calls: list[int] = []

    def logits_of(rows: torch.Tensor) -> torch.Tensor:
        calls.append(len(rows))
        return rows @ weight.t()

    def run(per_round: int) -> list[int]:
        args = (logits_of, Sampler(VOCAB, (), CPU), hidden, views, owners, offsets, None, per_round)
        return sample_in_rounds(*args)[0].token_ids

    in_rounds = run(ROUND)
    assert calls == [ROUND + 3 + 1, 4] and NOT_COMPUTED in in_rounds
    calls.clear()
    assert run(ALL) == want and calls == [len(owners)]
    # every emitted token (up to and with a run's first refusal) is the same either way
    assert all(t == want[i] for i, t in enumerate(in_rounds) if t != NOT_COMPUTED)


def test_only_torchs_int8_head_goes_in_rounds() -> None:
    """DecoderModel.head_per_row_block: the full int8 head costs a pass per block of rows; its
    candidate pass for plain greedy rows, and a float head, read the weights once a call."""
    with_candidates = SimpleNamespace(quant_head=SimpleNamespace(candidate_head=object()))
    without = SimpleNamespace(quant_head=SimpleNamespace(candidate_head=None))
    per_block = DecoderModel.head_per_row_block
    assert not per_block(with_candidates, argmax_only=True)  # type: ignore[arg-type]
    assert per_block(with_candidates, argmax_only=False)  # type: ignore[arg-type]
    assert per_block(without, argmax_only=True)  # type: ignore[arg-type]
    assert not per_block(SimpleNamespace(quant_head=None), argmax_only=False)  # type: ignore[arg-type]
    assert round_rows(True) == ROUND and round_rows(False) == ALL


def test_a_mask_taken_for_some_rows_keeps_their_bitmask_rows() -> None:
    bits = torch.arange(12, dtype=torch.int32).view(4, 3)
    mask = PendingMask([1, 3, 5, 6], bits, None, MaskStats())
    part = mask.take([3, 4, 5])
    assert part is not None and part.rows == [0, 2] and part.bits.tolist() == bits[[1, 2]].tolist()
    assert mask.take([0, 2]) is None
