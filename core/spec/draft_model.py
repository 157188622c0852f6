"""The `draft` drafter: a second, smaller model with the same tokenizer proposes k tokens greedily.

It runs on the engine thread, before the target's step, through a ModelRunner of its own (eager,
its own KV pool and block accounting, no prefix cache): per sequence a shadow `Seq` that shares the
sequence's prompt and output lists, with its own block table and counts. A proposal is k draft
steps: the first feeds every token the draft model has not seen yet (the whole prompt the first
time, then the tokens accepted since) and samples d_0; step j feeds d_{j-1} (the runner's future
buffer holds it, as for an overlapped decode) and samples d_j. After the target's step lands,
the shadow rolls back like the target's KV: its K/V are valid for the tokens the sequence kept.

Draft tokens are the draft model's argmax (point proposals: views.py's sample-and-compare is the
exact acceptance rule). When its pool runs out, shadows of sequences that are not drafting now
are dropped first, then the sequence goes without a draft this step.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import torch
from rillet.core.attention.kv_cache import resolve_kv_dtype
from rillet.core.build import load_model, load_tokenizer, max_model_len, resolve_precision, resolve_source
from rillet.core.config import ConfigError, ModelConfig, RilletConfig
from rillet.core.engine.block_manager import BlockManager
from rillet.core.engine.scheduler import ScheduledBatch
from rillet.core.model.decoder import DecoderModel, allocate_kv_cache
from rillet.core.runner.model_runner import ModelRunner
from rillet.core.runner.sampler import Sampler
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.spec.drafter import Draft
from rillet.core.tokenizer.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 30, ignore_eos=True)


class DraftModelDrafter:
    name = "draft"
    wants_hidden = False
    cheap = False  # each draft token is a step of the draft model

    def __init__(self, runner: ModelRunner, blocks: BlockManager, max_len: int) -> None:
        self.runner = runner
        self.blocks = blocks
        self.max_len = max_len  # positions the draft model can take
        self._shadow: dict[int, Seq] = {}  # seq_id -> the draft model's view of it
        # seq_id -> (position, draft tokens fed from there): K/V valid only where the sequence kept them
        self._fed: dict[int, tuple[int, list[int]]] = {}
        self.steps = 0  # draft model forwards (for the benchmark)

    def propose(self, seqs: list[Seq], ks: list[int], hidden: Any = None) -> list[Draft]:
        ks = [max(0, min(k, self.max_len - s.num_tokens)) for s, k in zip(seqs, ks, strict=True)]
        shadows = [self._shadow_of(s) for s in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        keep = {s.seq_id for s in seqs}
        for j in range(max(ks, default=0)):
            active = [i for i, k in enumerate(ks) if k > j]
            batch = ScheduledBatch()
            for i in active:
                sh = shadows[i]
                n = sh.num_scheduled_tokens - sh.num_computed
                if not self._room(sh, sh.num_computed + n, keep):
                    ks[i] = j  # no blocks for it: its draft ends here
                    continue
                batch.seqs.append(sh)
                batch.num_new.append(n)
            if not batch.seqs:
                break
            launched = self.runner.launch(batch)
            for sh, n in zip(batch.seqs, batch.num_new, strict=True):
                sh.num_computed += n
                sh.num_pending += 1
            result = launched.wait()
            self.steps += 1
            index = {sh.seq_id: t for sh, t in zip(launched.seqs, result.token_ids, strict=True)}
            for i in active:
                if ks[i] > j:
                    drafts[i].append(index[shadows[i].seq_id])
        for seq, draft in zip(seqs, drafts, strict=True):
            if len(draft) > 1:  # step j fed d_{j-1}: d_0 .. d_{-2} have K/V at num_tokens ...
                self._fed[seq.seq_id] = (seq.num_tokens, draft[:-1])
        return [Draft(d) for d in drafts]

    def _shadow_of(self, seq: Seq) -> Seq:
        sh = self._shadow.get(seq.seq_id)
        if sh is None:
            sh = Seq(seq.seq_id, seq.request_id, seq.prompt_ids, _GREEDY)
            sh.output_ids = seq.output_ids  # shared: the draft model sees what the sequence keeps
            self._shadow[seq.seq_id] = sh
        self._sync(seq, sh)
        return sh

    def _sync(self, seq: Seq, sh: Seq) -> None:
        """Rolls sh's K/V back to the tokens seq has: drafts it fed count where seq kept them."""
        sh.num_pending = 0
        valid = seq.num_tokens - 1  # the newest token is always fed again
        fed = self._fed.pop(seq.seq_id, None)
        if fed is not None:
            at, tokens = fed
            kept = seq.tokens(at, min(at + len(tokens), seq.num_tokens))
            same = next((i for i, (a, b) in enumerate(zip(tokens, kept, strict=False)) if a != b), len(kept))
            valid = min(valid, at + same)
        if sh.num_computed > valid:
            sh.num_computed = valid
            self.blocks.truncate(sh, valid + 1)

    def _room(self, sh: Seq, num_tokens: int, keep: set[int]) -> bool:
        """Blocks for `num_tokens` of sh, dropping shadows of sequences not drafting now if needed."""
        while not self.blocks.grow(sh, num_tokens):
            victim = next((v for v in self._shadow.values() if v.seq_id not in keep and v.block_table), None)
            if victim is None:
                return False
            self._free(victim)
        return True

    def landed(self, seq: Seq) -> None:
        sh = self._shadow.get(seq.seq_id)
        if sh is not None:
            self._sync(seq, sh)

    def release(self, seq: Seq) -> None:
        self._fed.pop(seq.seq_id, None)
        sh = self._shadow.pop(seq.seq_id, None)
        if sh is not None:
            self._free(sh)

    def _free(self, sh: Seq) -> None:
        self.blocks.free(sh)
        sh.num_pending = 0
        self.runner.release(sh)

    def close(self) -> None:
        for sh in list(self._shadow.values()):
            self._free(sh)
        self._shadow.clear()
        self.runner.close()


def load_draft_drafter(
    cfg: RilletConfig,
    target: DecoderModel,
    device: torch.device,
    dtype: torch.dtype,
    num_blocks: int,
    tokenizer: Tokenizer,
) -> DraftModelDrafter:
    """Loads speculative.draft_model like model.path (in the target's dtype, its weights as
    speculative.draft_quantization says), with a KV pool of `num_blocks` blocks (the target's)."""
    dcfg = replace(cfg, model=draft_model_config(cfg))
    try:
        src = resolve_source(dcfg)
        precision = resolve_precision(dcfg, src, device)
        if precision.dtype != dtype:  # the draft runs in the target's dtype whatever its weights
            named = str(dtype).removeprefix("torch.")
            dcfg = replace(dcfg, model=replace(dcfg.model, dtype=named))  # type: ignore[arg-type]
            precision = resolve_precision(dcfg, src, device)
        _check_tokenizer(load_tokenizer(src), tokenizer)
        model = load_model(dcfg, src, device, precision, lambda stage, frac: None)
    except ConfigError as exc:
        raise ConfigError("speculative.draft_model", str(exc).split(": ", 1)[-1]) from exc
    if model.arch.vocab_size > target.arch.vocab_size:
        raise ConfigError(
            "speculative.draft_model",
            f"its vocabulary ({model.arch.vocab_size}) is larger than the model's ({target.arch.vocab_size})",
        )
    kv_dtype = resolve_kv_dtype(cfg.cache.dtype, dtype, device)  # the target pool's storage
    kv = allocate_kv_cache(model.arch, num_blocks, cfg.cache.block_size, kv_dtype, device)
    runner = ModelRunner(model, kv, Sampler(model.arch.vocab_size, (), device), cfg.cache.block_size, device)
    log.info(
        "draft model %s: %d layers, %s weights, KV pool %d blocks",
        src.path,
        model.arch.num_layers,
        precision.quantization,
        num_blocks,
    )
    blocks = BlockManager(num_blocks, cfg.cache.block_size, enable_prefix_caching=False)
    return DraftModelDrafter(runner, blocks, max_model_len(dcfg, model.arch))


def draft_model_config(cfg: RilletConfig) -> ModelConfig:
    """The `model` section the draft model loads with: speculative.draft_model, its weights as
    speculative.draft_quantization says, and the target's model.dtype setting (not the dtype it
    resolved to: an explicit float32 would rule out int4 weights, so a 4-bit GGUF draft would run
    full-precision ones under draft_quantization auto; auto resolves to the target's dtype)."""
    sc = cfg.speculative
    return replace(
        cfg.model, path=sc.draft_model, kind="auto", quantization=sc.draft_quantization, served_name=None
    )


def _check_tokenizer(draft: Tokenizer, target: Tokenizer) -> None:
    a, b = draft.token_bytes_table(), target.token_bytes_table()
    n = min(len(a), len(b))
    if a[:n] != b[:n] or set(draft.eos_token_ids) != set(target.eos_token_ids):
        raise ConfigError(
            "speculative.draft_model", "its tokenizer differs from the model's (drafts would be other tokens)"
        )
