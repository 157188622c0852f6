"""The offline API: `LLM(config).generate(prompts, params)` drives the threaded engine to completion."""

from __future__ import annotations

import array
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rillet.core.config import RilletConfig, load_config
from rillet.core.engine.engine import Engine
from rillet.core.engine.inbox import NewEmbedding, NewRequest
from rillet.core.outputs import SeqDelta
from rillet.core.sampling_params import SamplingParams
from rillet.core.sequence import FinishReason, TokenLogprob
from rillet.core.vision.image import ImageInput


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None
    cached_tokens: int = 0
    error: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_ids: list[int]
    outputs: list[CompletionOutput]
    # params.prompt_logprobs: None for the first prompt token (nothing before it), then each one's
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


def _floats(le32: bytes) -> list[float]:
    a = array.array("f", le32)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tolist()


class LLM:
    """Owns an engine (started on construction) and consumes its ring on the caller's thread."""

    def __init__(self, cfg: RilletConfig | None = None, overrides: Sequence[str] = ()) -> None:
        cfg = cfg if cfg is not None else load_config(None, list(overrides))
        self.engine = Engine(cfg)
        self.tokenizer = self.engine.tokenizer
        self._event = threading.Event()
        self.engine.ring.set_notifier(self._event.set)
        self.engine.start()

    def close(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        n: int = 1,
        lora: str | Sequence[str | None] | None = None,
        priority: int | Sequence[int] = 0,
        images: Sequence[Sequence[ImageInput]] | None = None,
    ) -> list[RequestOutput]:
        """All prompts are submitted at once, so they run batched; results in prompt order.
        `lora`: a loaded LoRA adapter's name for every prompt, or one name (or None) per prompt;
        `priority`: one for every prompt, or one per prompt (lower first, scheduler.policy priority);
        `images`: a vision model's images of each prompt, in order (each prompt holds one
        placeholder per image, as its chat template writes them: core/vision/front.py)."""
        plist: list[SamplingParams]
        if params is None or isinstance(params, SamplingParams):
            plist = [params or SamplingParams()] * len(prompts)
        else:
            plist = list(params)
        if len(plist) != len(prompts):
            raise ValueError("params: need one SamplingParams per prompt, or a single one")
        loras = [lora] * len(prompts) if lora is None or isinstance(lora, str) else list(lora)
        if len(loras) != len(prompts):
            raise ValueError("lora: need one adapter name (or None) per prompt, or a single one")
        prios = list(priority) if isinstance(priority, Sequence) else [priority] * len(prompts)
        if len(prios) != len(prompts):
            raise ValueError("priority: need one per prompt, or a single one")
        results: dict[str, RequestOutput] = {}
        requests: list[NewRequest] = []
        pictures = list(images) if images is not None else [()] * len(prompts)
        if len(pictures) != len(prompts):
            raise ValueError("images: need one list of images per prompt")
        for prompt, p, adapter, prio, pics in zip(prompts, plist, loras, prios, pictures, strict=True):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            mm = None
            if pics:
                if self.engine.vision is None:
                    raise ValueError("images: the model does not take images")
                mp = self.engine.vision.expand(ids, pics)
                ids, mm = mp.prompt_ids, mp.mm
            rid = uuid.uuid4().hex
            results[rid] = RequestOutput(rid, ids, [CompletionOutput(i) for i in range(n)])
            requests.append(NewRequest(rid, ids, p, n=n, lora=adapter, priority=prio, mm=mm))
        self.engine.add_requests(requests)  # one inbox item: the first step sees them all
        self._collect(results)
        return [results[r.request_id] for r in requests]

    def embed(self, inputs: Sequence[str | list[int]], dimensions: int | None = None) -> list[list[float]]:
        """One vector per input (model.task embed or both), submitted at once; in input order."""
        vectors: dict[str, bytes] = {}
        order: list[str] = []
        new: list[NewEmbedding] = []
        for item in inputs:
            ids = self.tokenizer.encode(item) if isinstance(item, str) else [int(t) for t in item]
            rid = uuid.uuid4().hex
            order.append(rid)
            new.append(NewEmbedding(rid, ids, dimensions))
        self.engine.add_embeddings(new)  # one inbox item, all or none

        wanted = set(order)

        def take(d: SeqDelta) -> int:
            if d.finish_reason is None or d.request_id not in wanted:
                return 0
            if d.embedding is None:
                raise RuntimeError(f"embedding failed: {d.error or d.finish_reason.value}")
            vectors[d.request_id] = d.embedding
            return 1

        self._drain(take, len(order))
        return [_floats(vectors[rid]) for rid in order]

    def _collect(self, results: dict[str, RequestOutput]) -> None:
        def take(d: SeqDelta) -> int:
            req = results.get(d.request_id)
            if req is None:
                return 0
            out = req.outputs[d.index]
            out.token_ids.extend(d.token_ids)
            out.text += d.text
            out.cached_tokens = d.cached_tokens
            if d.prompt_logprobs is not None:
                req.prompt_logprobs = [None, *d.prompt_logprobs]
            if d.logprobs is not None:
                out.logprobs = (out.logprobs or []) + d.logprobs
            if d.finish_reason is None:
                return 0
            out.finish_reason, out.error = d.finish_reason, d.error
            return int(req.finished)

        self._drain(take, len(results))

    def _drain(self, take: Callable[[SeqDelta], int], unfinished: int) -> None:
        """Feeds every delta to `take` (which returns how many requests it finished) until none is left."""
        ring = self.engine.ring
        while unfinished > 0:
            for step in ring.pop_all():
                for d in step.deltas:
                    unfinished -= take(d)
            if unfinished and ring.prepare_wait():
                if not self.engine.healthy:
                    raise RuntimeError(self.engine.error or "engine died")
                self._event.wait(0.5)
                self._event.clear()
                ring.cancel_wait()
