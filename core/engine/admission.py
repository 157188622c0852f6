"""What a new request must pass before it is queued, and the sequences made from it.

Runs on the caller's thread (the event loop, the offline API), never the engine thread: it reads
only what the runtime fixed at load (the model's limits, tasks and vocabulary) and the thread-safe
LoRA registry and grammar cache. A refused request raises the error that names its field, before
any sequence or grammar matcher exists; the queue's room is the engine's to check (it owns the
inbox).
"""

from __future__ import annotations

import itertools

from rillet.core.embedding import EmbedParams
from rillet.core.engine.inbox import NewRequest
from rillet.core.errors import AdapterError, AdapterErrorKind, RequestError
from rillet.core.lora.adapter import LoraAdapter
from rillet.core.runtime import Runtime
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import Seq
from rillet.core.structured.compiler import GrammarCompiler
from rillet.core.structured.spec import GrammarSpec, GrammarUnavailable
from rillet.core.vision.payload import MmPayload

# An embedding sequence's: one step's worth of "output" (its vector), never sampled
_EMBED_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)


class Admission:
    def __init__(
        self, rt: Runtime, grammars: GrammarCompiler | None, no_grammar: str, priorities: bool = False
    ) -> None:
        """`priorities`: scheduler.policy is priority (under fcfs a priority other than 0 is
        refused, as vLLM refuses it: the client asked for an order it would not get)."""
        self.model_name = rt.model_name
        self.priorities = priorities
        self.tasks = rt.tasks
        self.max_model_len = rt.max_model_len
        self.lora = rt.lora  # LoRA adapters by name (None: the model serves none)
        self.embedding_size = rt.embedding_size  # components of a vector; None: no embeddings
        self._embed_every_token = rt.pooling is not None and rt.pooling.every_token
        self._embed_whole = rt.encoder
        vocab = rt.arch.vocab_size if rt.arch is not None else None
        self.vocab_size: int | None = vocab or getattr(rt.tokenizer, "vocab_size", None)
        self.grammars = grammars
        self._no_grammar = no_grammar  # why there is no grammar cache, for GrammarUnavailable
        self.vision = rt.vision is not None  # a vision-language model: requests may carry images
        self._seq_ids = itertools.count()  # next() is atomic under the GIL: any thread may add

    # ---- generation requests ---------------------------------------------------------------------
    def check(self, r: NewRequest) -> LoraAdapter | None:
        """Raises the error that refuses r; its LoRA adapter otherwise."""
        adapter = self.adapter(r.lora) if r.lora is not None else None
        if "generate" not in self.tasks:
            raise RequestError("model", f"{self.model_name} is an embedding model (model.task: embed)")
        self._check_priority(r.priority)
        self._check_mm(r)
        prompt_ids, params = r.prompt_ids, r.params
        if not prompt_ids:
            raise RequestError("prompt", "must contain at least one token")
        self._check_ids("prompt", prompt_ids)
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise RequestError(
                "prompt",
                f"{len(prompt_ids)} prompt tokens + max_tokens {params.max_tokens} exceed the "
                f"context length {self.max_model_len}",
            )
        if params.logit_bias and self.vocab_size and params.logit_bias[-1][0] >= self.vocab_size:
            raise RequestError(
                "logit_bias", f"holds token id {params.logit_bias[-1][0]} outside the vocabulary"
            )
        return adapter

    def _check_priority(self, priority: object) -> None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise RequestError("priority", f"must be an integer, got {priority!r}")
        if priority and not self.priorities:
            raise RequestError(
                "priority", f"is {priority} but priority scheduling is off (scheduler.policy: fcfs)"
            )

    def _check_mm(self, r: NewRequest) -> None:
        if r.mm is None:
            return
        if not self.vision:
            raise RequestError("messages", f"{self.model_name} does not take images")
        if not isinstance(r.mm, MmPayload) or any(it.end > len(r.prompt_ids) for it in r.mm.items):
            raise RequestError("messages", "the image payload does not match the prompt (VisionFront.expand)")

    def _check_ids(self, param: str, ids: list[int]) -> None:
        """Every id indexes the model's embeddings: a tokenizer larger than the model (a folder
        without tokenizer.json borrows the default model's) must not reach the step with one."""
        low, top = min(ids), max(ids)
        if self.vocab_size and (top >= self.vocab_size or low < 0):
            bad = top if top >= self.vocab_size else low
            raise RequestError(
                param, f"holds token id {bad} outside the model's vocabulary of {self.vocab_size}"
            )

    def make_seqs(self, r: NewRequest, adapter: LoraAdapter | None) -> list[Seq]:
        """r's n sequences (a checked request): seeds step by one per sibling, grammars matched."""
        seqs: list[Seq] = []
        for i in range(r.n):
            p = r.params
            if i and p.seed is not None:
                p = SamplingParams(**{**p.__dict__, "seed": p.seed + i})
            seq = Seq(next(self._seq_ids), r.request_id, list(r.prompt_ids), p, index=i, deadline=r.deadline)
            seq.leader = seqs[0] if seqs else None
            seq.priority = r.priority
            if p.prompt_logprobs is not None and i == 0:
                seq.prompt_lps = []
            seq.lora = adapter
            seq.mm = r.mm  # type: ignore[assignment]  # checked: an MmPayload or None
            if p.grammar is not None:
                self.prepare_grammar(p.grammar)  # a cache hit after the HTTP layer's prepare
                assert self.grammars is not None
                seq.grammar = self.grammars.matcher(p.grammar)
            seqs.append(seq)
        return seqs

    def prepare_grammar(self, spec: GrammarSpec) -> None:
        """Compiles `spec` into the grammar cache. Raises GrammarError (a ValueError) naming the field."""
        if self.grammars is None:
            raise GrammarUnavailable(spec.param, self._no_grammar)
        self.grammars.compile(spec)

    def adapter(self, name: str) -> LoraAdapter:
        if self.lora is None:
            raise AdapterError(AdapterErrorKind.NOT_FOUND, name, f"The model '{name}' does not exist")
        return self.lora.get(name)

    # ---- embedding inputs ------------------------------------------------------------------------
    def embedding_seq(
        self, request_id: str, prompt_ids: list[int], dimensions: int | None, deadline: float | None
    ) -> Seq:
        """One input of /v1/embeddings as a prompt-only sequence, or the error that refuses it."""
        size = self.embedding_size
        if size is None:
            raise RequestError("model", f"{self.model_name} does not serve embeddings (model.task)")
        if not prompt_ids:
            raise RequestError("input", "must contain at least one token")
        self._check_ids("input", prompt_ids)
        if len(prompt_ids) > self.max_model_len:
            raise RequestError(
                "input", f"{len(prompt_ids)} tokens exceed the model's limit of {self.max_model_len}"
            )
        if dimensions is not None and not 1 <= dimensions <= size:
            raise RequestError("dimensions", f"must be in [1, {size}], got {dimensions}")
        seq = Seq(next(self._seq_ids), request_id, list(prompt_ids), _EMBED_SAMPLING, deadline=deadline)
        seq.embed = EmbedParams(dimensions, self._embed_every_token, self._embed_whole)
        return seq
