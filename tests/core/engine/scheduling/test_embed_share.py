"""Chat beside an embedding flood in one engine (model.task both): generation sequences are
admitted first, embeddings take tokens only within the engine's embedding share, and the share
holds chat at >= 0.8x its speed alone on a simulated CPU (costs, not clocks: no timing here)."""

from __future__ import annotations

from rillet.core.config import SchedulerConfig
from rillet.core.embedding import EmbedParams
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.core import EngineCore
from rillet.core.engine.detokenizer import IncrementalDetokenizer
from rillet.core.engine.scheduler import ScheduledBatch, Scheduler
from rillet.core.engine.scheduling.embed_share import (
    FIRST_ALONE_CHUNK,
    GRACE_S,
    MAX_STALL_S,
    MIN_CHUNK,
    EmbedShare,
)
from rillet.core.runner.synthetic import SyntheticRunner
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, Seq


def make(tokens: int = 2048, seqs: int = 64) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=tokens), BlockManager(4096, 16)
    )


def chat(i: int, prompt_len: int = 8, max_tokens: int = 10**6) -> Seq:
    return Seq(
        i, f"c{i}", [1 + (i + k) % 50 for k in range(prompt_len)], SamplingParams(max_tokens=max_tokens)
    )


def embedding(i: int, prompt_len: int = 128) -> Seq:
    seq = Seq(i, f"e{i}", [100 + (i * 7 + k) % 50 for k in range(prompt_len)], SamplingParams(max_tokens=1))
    seq.embed = EmbedParams(every_token=True)
    return seq


def advance(s: Scheduler, batch: ScheduledBatch) -> int:
    """As the engine does (synchronously): returns the embeddings finished by this step."""
    done = 0
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        seq.num_computed += n
        if seq.num_computed < seq.num_tokens:
            continue
        if seq.embed is not None:
            s.finish(seq, FinishReason.STOP)
            done += 1
        else:
            seq.output_ids.append(7)
    return done


def test_chat_is_admitted_before_embeddings_queued_earlier() -> None:
    s = make()
    for i in range(3):
        s.add(embedding(i))
    s.add(chat(10))
    s.embed_cap = 0  # the engine's share allows no embedding tokens this step
    batch = s.schedule()
    assert [q.request_id for q in batch.seqs] == ["c10"] and batch.embed_tokens == 0
    assert len(s.waiting_embed) == 3


def test_the_cap_holds_embedding_tokens_while_chat_runs_and_a_grace_after() -> None:
    s = make()
    s.add(chat(10))
    for i in range(3):
        s.add(embedding(i))
    s.embed_cap = 100
    batch = s.schedule()
    assert batch.embed_tokens == 100 and batch.num_tokens == 8 + 100  # one chunk within the cap
    advance(s, batch)
    s.embed_cap = 0
    batch = s.schedule()  # the chunked embedding waits; chat decodes
    assert batch.embed_tokens == 0 and [q.request_id for q in batch.seqs] == ["c10"]
    share = EmbedShare(0.2)
    assert share.cap(generation=True, now=100.0) == 0  # no chat step measured yet
    assert share.cap(generation=False, now=100.0 + GRACE_S / 2) == 0  # chat just left: still held
    assert share.cap(generation=False, now=101.0 + GRACE_S) == FIRST_ALONE_CHUNK  # no chat: measure


def test_without_chat_steps_are_bounded_by_their_measured_cost() -> None:
    share = EmbedShare(0.2)
    share.observe(FIRST_ALONE_CHUNK * 0.001, FIRST_ALONE_CHUNK, 0, 0)  # 1 ms a token, no chat rows
    assert share.cap(generation=False, now=100.0) == int(MAX_STALL_S / 0.001)
    share.observe(MIN_CHUNK * 0.1, MIN_CHUNK, 0, 0)  # a slow host: never below one chunk
    assert share.cap(generation=False, now=100.0) == MIN_CHUNK


def test_a_chunk_dearer_than_the_stall_bound_still_runs() -> None:
    """A CPU where MIN_CHUNK embedding tokens cost more than MAX_STALL_S: the credit kept grows to
    one chunk's cost, so embeddings advance (at the share) instead of starving."""
    share = EmbedShare(0.2)
    share.observe(0.1, 0, 8, 8)  # chat alone: 100 ms a step
    share.cap(generation=True, now=0.0)
    share.observe(0.1 + MIN_CHUNK * 0.02, MIN_CHUNK, 8, 8)  # 20 ms an embedding token
    for _ in range(200):  # chat steps earn credit
        share.observe(0.1, 0, 8, 8)
    assert share.cap(generation=True, now=1.0) >= MIN_CHUNK


def simulate(flood: int, steps: int = 4000, head_start: float = 0.0) -> tuple[float, int, EmbedShare]:
    """8 chat clients (64 tokens a request, the next sent a step after the last ends) beside `flood`
    embedding inputs of 128 tokens, queued `head_start` seconds before the chat. Costs as on this
    CPU: a compiled decode-only step 25 ms; a step with any prefill row runs eager (+15 ms); each
    prefill token 5 ms. -> (chat tokens per second from its arrival, embeddings finished, the
    share's state)."""
    s, share = make(), EmbedShare(0.2)
    for i in range(flood):
        s.add(embedding(1000 + i))
    clock, chat_tokens, embedded = 0.0, 0, 0
    while clock < head_start:  # the flood alone, as EngineCore.step runs it
        s.embed_cap = share.cap(False, 100.0 + clock)
        batch = s.schedule()
        seconds = 0.04 + 0.005 * batch.num_tokens
        share.observe(seconds, batch.embed_tokens, 0, 0)
        embedded += advance(s, batch)
        clock += seconds
    arrival = head_start  # the chat waits for the step in flight
    for i in range(8):
        s.add(chat(i, prompt_len=1, max_tokens=64))
    resend: list[int] = []
    for step in range(steps):
        if s.num_embeds:  # as EngineCore.step
            s.embed_cap = share.cap(s.has_generation, 100.0 + clock)
        batch = s.schedule()
        prefill = batch.num_tokens - (len(batch.seqs) - batch.embed_rows)
        seconds = 0.025 + (0.015 + 0.005 * prefill if batch.embed_rows else 0.0)
        gen_rows = len(batch.seqs) - batch.embed_rows
        share.observe(seconds, batch.embed_tokens, gen_rows, batch.num_tokens - batch.embed_tokens)
        embedded += advance(s, batch)
        for k in resend:  # the clients' next requests arrive
            s.add(chat(10 * step + k, prompt_len=1, max_tokens=64))
        resend = []
        for seq in [q for q in s.running if q.embed is None and len(q.output_ids) >= 64]:
            s.finish(seq, FinishReason.LENGTH)
            resend.append(len(resend))
        clock += seconds
        chat_tokens += gen_rows
    return chat_tokens / (clock - arrival), embedded, share


def test_the_share_keeps_chat_at_0_8_of_its_speed_on_a_simulated_cpu() -> None:
    alone, _, _ = simulate(flood=0)
    flooded, embedded, share = simulate(flood=400)
    print(f"chat {flooded / alone:.3f}x alone, {embedded} embeddings")
    assert flooded >= 0.8 * alone, flooded / alone
    assert embedded >= 30  # the flood advances (~0.2 of the engine at ~0.7 s per input)
    assert share.token_s is not None and abs(share.token_s - 0.005) < 0.002  # the cost was measured


def test_chat_arriving_into_a_flood_waits_one_bounded_step() -> None:
    """The flood has the engine to itself for a while, then chat arrives (the bench's order): the
    steps it ran alone are MAX_STALL_S long, not a whole token budget (2048 x 5 ms here)."""
    alone, _, _ = simulate(flood=0)
    flooded, embedded, share = simulate(flood=400, head_start=3.0)
    assert flooded >= 0.8 * alone, flooded / alone
    assert share.alone_token_s is not None and embedded >= 30


def test_a_step_measured_free_leaves_the_cap_finite() -> None:
    share = EmbedShare(0.2)
    share.observe(0.02, 0, 8, 8)  # chat alone: 20 ms
    share.observe(0.01, 100, 8, 8)  # with 100 embedding tokens, measured faster (timer noise)
    cap = share.cap(generation=True, now=0.0)
    assert cap is not None and cap > 0


def test_chat_that_waits_for_blocks_held_by_capped_embeddings_is_not_stuck() -> None:
    """An embedding mid-prefill holds most of the pool; chat arrives needing more blocks than are
    free. The share caps embeddings at 0 (no chat step has run to earn credit) and the chat cannot
    be admitted: with nothing scheduled, no step earns credit either. The engine must go on."""
    blocks = BlockManager(6, 16)  # 5 usable blocks: 80 tokens
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), blocks)
    table = [bytes([97 + i % 26]) for i in range(256)]
    core = EngineCore(
        s,
        SyntheticRunner(0.0, list(range(100, 200))),
        lambda q: IncrementalDetokenizer(table, frozenset(), q.params, ()),
        80,
        serves_both=True,
    )
    flood = embedding(0, prompt_len=80)
    core.add([flood])
    core.step()  # alone: a first chunk of 64 tokens, 4 of the 5 blocks
    assert flood.num_computed == 64 and blocks.num_free == 1
    talk = chat(1, prompt_len=20, max_tokens=4)  # 2 blocks
    core.add([talk])
    for _ in range(20):
        core.step()
    assert talk.finish_reason is FinishReason.LENGTH and len(talk.output_ids) == 4
    assert flood.finish_reason is FinishReason.STOP
    blocks.check_integrity()
    assert blocks.num_used == 0


def test_an_embedding_that_preempts_itself_counts_no_tokens_in_the_step() -> None:
    """The step's embedding tokens and rows are what it runs (the share is charged by them): an
    embedding chunk with no blocks left preempts itself and runs nothing."""
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32), BlockManager(4, 16))
    talk, flood = chat(0, prompt_len=16), embedding(1, prompt_len=40)
    s.add(talk)
    s.add(flood)
    advance(s, s.schedule())  # 16 tokens each: a block each
    batch = s.schedule()  # chat's next token takes the last block; the embedding's chunk finds none
    assert batch.preempted == [flood] and batch.seqs == [talk]
    assert (batch.embed_tokens, batch.embed_rows) == (0, 0)
