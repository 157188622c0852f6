"""What the HTTP layer needs from an engine, as Protocols: the server never imports torch itself.

`rillet.core.engine.Engine` satisfies these structurally; so does the test double in
tests/http/fake_engine.py. The exception classes are looked up on the engine's own module so
that the front end stays importable (and testable) without loading the model stack.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from rillet.core.config import RilletConfig
from rillet.core.engine.block_manager import PrefixFlush
from rillet.core.engine.inbox import NewEmbedding, NewRequest
from rillet.core.outputs import StepOutput
from rillet.core.ring import SpscRing
from rillet.core.sampling_params import SamplingParams
from rillet.core.vision.front import VisionFront


class TokenizerLike(Protocol):
    eos_token_ids: Sequence[int]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...

    def id_to_token(self, token_id: int) -> str: ...

    def token_bytes(self, token_id: int) -> bytes | None: ...


class StatsLike(Protocol):
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_tokens_total: int
    steps: int
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    cached_blocks: int


class EngineLike(Protocol):
    cfg: RilletConfig
    model_name: str
    max_model_len: int
    ring: SpscRing[StepOutput]
    error: str | None
    tasks: frozenset[str]  # what the model serves: generate, embed (model.task)
    embedding_size: int | None  # components of an embedding; None: the model does not embed
    vision: VisionFront | None  # a vision-language model's image front end; None: text only

    @property
    def tokenizer(self) -> Any: ...  # TokenizerLike; Any so concrete tokenizer classes need not match exactly

    @property
    def healthy(self) -> bool: ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int = 1,
        deadline: float | None = None,
        lora: str | None = None,  # a loaded LoRA adapter's name (engines without LoRA: never given)
    ) -> None: ...

    def add_requests(self, requests: Sequence[NewRequest]) -> None:
        """Queued as one: taken together by the engine's next step; all or none (raises)."""
        ...

    def add_embeddings(self, inputs: Sequence[NewEmbedding]) -> None:
        """One /v1/embeddings request's inputs, queued as one; all or none (raises)."""
        ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> StatsLike: ...


class AdapterInfoLike(Protocol):
    name: str
    path: str
    rank: int
    nbytes: int


class LoraEngine(Protocol):
    """What the LoRA routes need of an engine that serves adapters (core/engine/engine.py)."""

    def lora_adapters(self) -> Sequence[AdapterInfoLike]: ...

    def load_lora(self, name: str, path: str) -> None: ...

    def unload_lora(self, name: str) -> None: ...


class WorkerEngine(Protocol):
    """What the routers' worker API (http/worker/) needs beyond EngineLike (core/engine/engine.py)."""

    model_path: str  # the weights' file or folder
    model_type: str  # Hugging Face model_type

    def flush_prefix_cache(self) -> Future[PrefixFlush]:
        """Runs on the engine thread; EngineDeadError when it is gone."""
        ...


ProgressFn = Callable[[str, float], None]


def vocab_size(tokenizer: Any) -> int | None:
    size = getattr(tokenizer, "vocab_size", None)
    return size if isinstance(size, int) and size > 0 else None
