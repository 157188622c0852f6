"""The parts of speculative decoding, without a model: the n-gram lookup, the adaptive draft
length, where a draft is cut, the scheduler planning 1 + k tokens (a draft never preempts), and the
block manager giving back the slots of refused drafts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from rillet.core.config import ConfigError, SchedulerConfig, config_from_dict
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.scheduler import Scheduler
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.spec.adaptive import MIN_ACCEPTANCE, PAUSE_STEPS, WINDOW, AdaptiveK
from rillet.core.spec.draft_length import (
    CPU_ROW_COST,
    CPU_ROW_COST_NO_TILES,
    CUDA_ROW_COST,
    ByMatch,
    prior_q,
    resolve_row_cost,
)
from rillet.core.spec.drafter import Draft
from rillet.core.spec.ngram import NgramDrafter
from rillet.core.spec.speculator import Speculator
from rillet.core.spec.views import accepted_run, position_views, runs_of

EOS = 2


def seq(prompt: list[int], output: list[int] | None = None, i: int = 0, **params: Any) -> Seq:
    s = Seq(i, f"r{i}", list(prompt), SamplingParams(**{"max_tokens": 64, **params}))
    s.output_ids = list(output or [])
    s.num_computed = s.num_tokens - 1  # decoding: only the newest token lacks K/V
    return s


def test_ngram_proposes_what_followed_the_latest_match_of_the_longest_suffix() -> None:
    d = NgramDrafter(2, 3)
    s = seq([5, 6, 7, 8, 9, 5, 6, 7, 1, 5, 6])
    assert d.lookup(s, 3) == Draft([7, 1, 5], 2)  # (5, 6) last seen before position 7 -> 7, 1, 5
    s.output_ids.append(7)  # suffix (5, 6, 7): latest earlier occurrence is followed by 1
    assert d.lookup(s, 4) == Draft([1, 5, 6, 7], 3)
    s.output_ids.append(3)  # (7, 3) and (6, 7, 3) never occurred
    assert d.lookup(s, 4).tokens == []
    assert d.lookup(seq([4], i=1), 4).tokens == []  # too short to have a suffix and a match
    assert d.lookup(seq([4, 4, 4], i=2), 4) == Draft([4], 2)  # the match may overlap the suffix


def test_ngram_index_grows_with_the_sequence_and_is_released() -> None:
    d = NgramDrafter(1, 2)
    s = seq([1, 2, 3])
    assert d.lookup(s, 2).tokens == []
    s.output_ids += [1]
    assert d.lookup(s, 2).tokens == [2, 3]
    d.release(s)
    assert not d._index


def test_adaptive_k_follows_acceptance_and_pauses_when_drafts_are_refused() -> None:
    a = AdaptiveK(4)
    assert a.next_k() == 4
    a.observe(4, 1)
    assert a.next_k() == 2  # the accepted run + 1
    a.observe(2, 2)
    assert a.next_k() == 3  # all accepted: one more
    a.observe(0, 0)  # nothing drafted: no change
    assert a.next_k() == 3
    b = AdaptiveK(4)
    drafted = 0
    while drafted < WINDOW:
        b.observe(4, 0)
        drafted += 4
    assert [b.next_k() for _ in range(PAUSE_STEPS)] == [0] * PAUSE_STEPS
    assert b.next_k() == 1  # tries again, carefully
    good = AdaptiveK(4)
    for _ in range(3 * WINDOW):
        good.observe(4, 4 if _ % 2 else 1)  # 62 % accepted: never paused
        assert good.next_k() > 0
    assert MIN_ACCEPTANCE < 0.62


def speculator(**over: Any) -> Speculator:
    # row_cost 0: every proposed token is kept (the draft length has tests of its own)
    spec = {"method": "ngram", "ngram_min": 1, "row_cost": 0.0, **over}
    cfg = config_from_dict({"speculative": spec}).speculative
    return Speculator(cfg, NgramDrafter(cfg.ngram_min, cfg.ngram_max), 64, (EOS,))


def test_by_match_drafts_what_pays_per_matched_suffix_length() -> None:
    b = ByMatch(8, 0.1)
    eight = list(range(8))
    # prior q = 1 - 0.6 / n: a 4-token match drafts long before anything is seen (0.85^8 > 0.1),
    # a 1-token match short (0.4^2 >= 0.1 > 0.4^3)
    assert [b.keep(Draft(eight, n)) for n in (4, 3, 2, 1)] == [8, 8, 6, 2]
    assert [prior_q(n) for n in (1, 2, 4)] == pytest.approx([0.4, 0.7, 0.85])
    # B sequences running: the bar is B x row_cost (0.4^2 < 0.2; 0.85^5 >= 0.4 > 0.85^6)
    assert [ByMatch(8, 0.1).keep(Draft(eight, n), batch) for n, batch in ((1, 2), (4, 4))] == [1, 5]
    for _ in range(6):
        b.keep(Draft(eight, 4))
        b.observe(3, 3)  # 4-token matches are always right: q rises, 8 stay kept
    assert b.keep(Draft(eight, 4)) == 8
    assert b.keep(Draft(eight[:5], 4)) == 5  # never more than proposed
    kept = []
    for _ in range(8):  # 1-token matches are always wrong: q = 0.8 / (refusals + 2)
        kept.append(b.keep(Draft(eight, 1)))
        b.observe(kept[-1], 0)
    assert kept == [2, 1, 1, 1, 1, 1, 1, 0]  # q = 0.8 / 9 < 0.1: it stopped drafting
    assert b.keep(Draft(eight, 4)) == 8  # the other match length is unaffected
    silent = 0
    while b.keep(Draft(eight, 1)) == 0:  # each silent match forgets a share of the refusals
        silent += 1
        assert silent < 100
    assert silent > 0
    assert ByMatch(8, 0.0).keep(Draft(eight, 1)) == 8  # row_cost 0 keeps everything
    assert b.keep(Draft([], 0)) == 0


def test_row_cost_defaults_by_device_unless_set() -> None:
    assert resolve_row_cost(None, "cpu") == CPU_ROW_COST > resolve_row_cost(None, "cuda") == CUDA_ROW_COST
    # int4 rows whose products cost per row (no AMX tiles): a drafted token must be likelier
    assert resolve_row_cost(None, "cpu", rows_cheap=False) == CPU_ROW_COST_NO_TILES > CPU_ROW_COST
    assert resolve_row_cost(None, "cuda", rows_cheap=False) == CUDA_ROW_COST
    assert resolve_row_cost(0.3, "cuda") == 0.3 and resolve_row_cost(0.0, "cpu", rows_cheap=False) == 0.0
    assert config_from_dict({}).speculative.row_cost is None
    spec = Speculator(
        config_from_dict({}).speculative, NgramDrafter(1, 4), 64, (EOS,), "cpu", rows_cheap=False
    )
    assert spec.row_cost == CPU_ROW_COST_NO_TILES


def test_verify_rows_are_cheap_with_float_weights_or_int4_through_tiles() -> None:
    from rillet.core.quant import rows_kernel
    from rillet.core.spec.setup import verify_rows_cheap

    def model(int4: bool, kernel: bool) -> Any:
        return SimpleNamespace(int4_weights=int4, int4_rows_kernel=kernel)

    assert verify_rows_cheap(model(False, False))
    assert not verify_rows_cheap(model(True, False))  # torch's int4 kernel: a pass per 4 rows
    assert verify_rows_cheap(model(True, True)) == rows_kernel.has_amx()


def test_lookups_are_cut_by_match_and_model_drafts_by_adaptive_k() -> None:
    loop = [7, 8, 9] * 6
    spec = speculator(row_cost=0.1, num_tokens=8)
    s = seq(loop, [7])
    spec.propose([s])
    assert s.draft_ids == [8, 9, 7]  # a fresh request keeps 3 of the lookup's 8 (q = 1/2)

    class Model(NgramDrafter):
        cheap = False  # as a draft model: told k up front, its proposal kept whole

        def propose(self, seqs: list[Seq], ks: list[int], hidden: Any = None) -> list[Draft]:
            return [Draft([1] * k) for k in ks]

    cfg = config_from_dict({"speculative": {"method": "ngram", "num_tokens": 5}}).speculative
    model = Speculator(cfg, Model(1, 2), 64, (EOS,))
    t = seq(loop, [7], i=1)
    model.propose([t])
    assert t.draft_ids == [1] * 5
    model.observe(t, 5, 1)
    model.propose([t])
    assert t.draft_ids == [1] * 2  # adaptive k: the accepted run + 1


def test_drafts_stop_at_max_tokens_the_context_limit_and_a_stop_token() -> None:
    loop = [7, 8, 9] * 4
    s = seq(loop, [7], max_tokens=4)
    speculator().propose([s])
    assert s.draft_ids == [8, 9]  # 1 output + 2 drafts + the model's own token = max_tokens
    long = seq(list(range(3, 40)) * 2, [3])  # 75 tokens: the context limit is 64... already past
    speculator().propose([long])
    assert long.draft_ids == []
    eos = seq([7, 8, EOS, 4, 7, 8], [])
    speculator().propose([eos])
    assert eos.draft_ids == [EOS]  # nothing after a token that would end the sequence
    ignored = seq([7, 8, EOS, 4, 7, 8], [], ignore_eos=True)
    speculator().propose([ignored])
    assert ignored.draft_ids == [EOS, 4, 7, 8]
    stop = seq([7, 8, 5, 4, 7, 8], [], stop_token_ids=[5])
    speculator().propose([stop])
    assert stop.draft_ids == [5]


def test_only_decoding_sequences_draft_and_none_above_max_batch() -> None:
    seqs = [seq([7, 8, 9] * 3, i=i) for i in range(3)]
    seqs[1].num_computed = 2  # in prefill
    seqs[2].num_pending = 1  # a token in flight
    spec = speculator(max_batch=3)
    spec.propose(seqs)
    assert [bool(s.draft_ids) for s in seqs] == [True, False, False]
    spec.propose([*seqs, seq([7, 8, 9] * 3, i=3)])  # four running > max_batch: none, and cleared
    assert not any(s.draft_ids for s in seqs)


def test_views_see_the_drafts_before_their_position() -> None:
    s = seq([1, 2], [3], repetition_penalty=1.2)
    s.draft_ids = [4, 5]
    v = position_views([s, s, s], [0, 1, 2])
    assert v[0] is s and v[1].output_ids == [3, 4] and v[2].output_ids == [3, 4, 5]
    plain = seq([1, 2], [3])
    plain.draft_ids = [4, 5]
    w = position_views([plain] * 3, [0, 1, 2])
    assert [x.num_generated for x in w] == [1, 2, 3] and w[2].seq_id == plain.seq_id
    assert accepted_run([4, 5, 6], [4, 5, 9, 1]) == 2
    assert accepted_run([4, 5], [4, 5, 1]) == 2
    assert accepted_run([4], [3, 1]) == 0


def test_runs_of_groups_each_sequence_s_positions() -> None:
    assert runs_of([0, 0, 1, 2, 0, 0, 1]) == [(0, 1), (1, 3), (4, 1), (5, 2)]
    assert runs_of([]) == []


def test_scheduler_plans_the_draft_cuts_it_to_the_budget_and_never_preempts_for_it() -> None:
    blocks = BlockManager(6, 4)  # 5 usable blocks of 4 tokens
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=6), blocks)
    a, b = seq([1, 2, 3, 4, 5], i=0), seq([6, 7, 8, 9, 10, 11, 12], i=1)
    for s in (a, b):
        s.num_computed = 0
        sched.add(s)
    first = sched.schedule()  # a's prompt (5) + 1 of b's
    assert first.num_new == [5, 1]
    a.num_computed, b.num_computed = 5, 7  # b: pretend its prompt is done
    a.output_ids.append(13)
    b.output_ids.append(19)
    a.draft_ids = [14, 15, 16, 17, 18]
    batch = sched.schedule()
    assert batch.seqs == [a, b] and batch.num_new == [5, 1]  # the draft cut to 4: b keeps its token
    assert a.draft_ids == [14, 15, 16, 17] and len(a.block_table) == 3 and len(b.block_table) == 2
    a.num_computed, b.num_computed = 10, 8
    # a keeps 1 draft + the model's token and rolls back; b drafts more than the pool can hold
    a.output_ids += [14, 20]
    a.num_computed = a.num_tokens - 1
    blocks.truncate(a, a.num_tokens)
    a.draft_ids = []
    b.output_ids.append(21)
    b.draft_ids = [1] * 5  # 1 + 5 tokens from slot 8: 4 blocks, 2 more than b holds, 1 is free
    assert len(a.block_table) == 2 and blocks.num_free == 1
    batch = sched.schedule()
    assert batch.preempted == [] and b.draft_ids == [] and batch.num_new == [1, 1]
    assert len(b.block_table) == 3
    blocks.check_integrity()


def test_truncate_gives_back_the_blocks_past_the_accepted_end() -> None:
    blocks = BlockManager(10, 4)
    s = seq([1, 2, 3, 4, 5, 6], [])
    s.num_computed = 0
    blocks.admit(s, 64)
    s.num_computed = 6
    blocks.commit(s)
    assert blocks.grow(s, 6 + 1 + 5)  # the last token + 5 drafts: 12 slots, 3 blocks
    assert len(s.block_table) == 3
    s.output_ids += [9, 9]  # one draft accepted + the model's token: 8 tokens
    table = s.block_table
    blocks.truncate(s, s.num_tokens)
    assert len(s.block_table) == 2 and blocks.num_used == 2
    # a new list: the runner's mirror of the table must not take a regrown table for the old one
    assert s.block_table is not table and s.block_table == table[:2]
    blocks.free(s)
    blocks.check_integrity()


@pytest.mark.parametrize(
    ("over", "key"),
    [
        ({"method": "bogus"}, "speculative.method"),
        ({"num_tokens": 0}, "speculative.num_tokens"),
        ({"num_tokens": 17}, "speculative.num_tokens"),
        ({"ngram_min": 0}, "speculative.ngram_min"),
        ({"ngram_min": 3, "ngram_max": 2}, "speculative.ngram_max"),
        ({"max_batch": 0}, "speculative.max_batch"),
        ({"row_cost": 1.0}, "speculative.row_cost"),
        ({"row_cost": -0.1}, "speculative.row_cost"),
        ({"method": "draft"}, "speculative.draft_model"),
    ],
)
def test_bad_values_name_their_key(over: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"speculative": over})
    assert err.value.key == key and "\n" not in str(err.value)
