"""/v1/embeddings in OpenAI's shape: the request body -> token ids per input, or a 400; the vectors
-> the response body.

`input`: a string, an array of strings, an array of token ids, or an array of such arrays (empty
strings and arrays are refused, as OpenAI does). An input longer than the model's limit is a 400
naming the limit, unless `truncate_prompt_tokens` (vLLM's field; -1 = the model's limit) asks for
it to be cut: text keeps its first tokens (and the tokenizer's special tokens, e.g. BERT's [CLS]
and [SEP]), token ids keep their last ones, as vLLM does. `encoding_format`: `float` (numbers in
float32's shortest form) or `base64` (the little-endian float32 bytes, which the openai client asks
for by default). `dimensions`: the first N components, renormalized (Matryoshka models).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from rillet.http.openai.errors import ApiError, bad_request, model_not_found
from rillet.http.openai.fields import Body, check_vocab, is_int, opt_int, opt_str, type_name
from rillet.http.openai.protocol import Limits

_INPUT_SHAPE = "a string, an array of strings, an array of token ids or an array of token-id arrays"


@dataclass(frozen=True)
class EmbedRequest:
    inputs: list[list[int]]  # token ids per input
    dimensions: int | None
    base64: bool  # encoding_format base64 (else float)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)


def wrong_task(model: str, endpoint: str, serves: str) -> ApiError:
    """A model asked for what its server was not started to do (model.task)."""
    return ApiError(
        400,
        f"The model '{model}' does not serve {endpoint}: this server was started for {serves} (model.task)",
        param="model",
        code="unsupported_task",
    )


def parse_embeddings(body: Body, tokenizer: Any, limits: Limits, embedding_size: int) -> EmbedRequest:
    _check_model(body, limits)
    fmt = opt_str(body, "encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise bad_request(
            f"'encoding_format' must be 'float' or 'base64', got {fmt!r}", param="encoding_format"
        )
    dimensions = opt_int(body, "dimensions", 1)
    if dimensions is not None and dimensions > embedding_size:
        raise bad_request(
            f"'dimensions' must be <= {embedding_size} (this model's embedding size), got {dimensions}",
            param="dimensions",
            code="invalid_value",
        )
    truncate = opt_int(body, "truncate_prompt_tokens", -1, limits.max_model_len)
    if truncate == 0:
        raise bad_request("'truncate_prompt_tokens' must be -1 or >= 1", param="truncate_prompt_tokens")
    if truncate == -1:
        truncate = limits.max_model_len
    opt_str(body, "user")
    inputs = _inputs(body.get("input"), tokenizer, limits, truncate)
    return EmbedRequest(inputs, dimensions, fmt == "base64")


def _check_model(body: Body, limits: Limits) -> None:
    model = body.get("model")
    if model is None:
        raise bad_request(
            "you must provide a model parameter", param="model", code="missing_required_parameter"
        )
    if not isinstance(model, str):
        raise bad_request(
            f"'model' must be a string, got {type_name(model)}", param="model", code="invalid_type"
        )
    if model != limits.model_name:
        raise model_not_found(model)


def _inputs(value: Any, tokenizer: Any, limits: Limits, truncate: int | None) -> list[list[int]]:
    if value is None:
        raise bad_request("you must provide an input", param="input", code="missing_required_parameter")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise bad_request(f"'input' must be {_INPUT_SHAPE}, got {type_name(value)}", param="input")
    if not value:
        raise bad_request("'input' must not be empty", param="input")
    if all(is_int(v) for v in value):  # one input of token ids, however long
        value = [value]
    if len(value) > limits.max_prompts:
        raise bad_request(
            f"'input' holds {len(value)} inputs; at most {limits.max_prompts} per request", param="input"
        )
    if all(isinstance(v, str) for v in value):
        return [_text(t, i, tokenizer, limits, truncate) for i, t in enumerate(value)]
    if not all(isinstance(p, list) and all(is_int(t) for t in p) for p in value):
        raise bad_request(f"'input' must be {_INPUT_SHAPE}", param="input")
    return [_ids(list(p), i, limits, truncate) for i, p in enumerate(value)]


def _text(text: str, i: int, tokenizer: Any, limits: Limits, truncate: int | None) -> list[int]:
    if not text:
        raise bad_request(f"'input[{i}]' is an empty string", param="input")
    ids: list[int] = tokenizer.encode(text)
    if len(ids) > limits.max_model_len and truncate is None:
        raise _too_long(i, len(ids), limits.max_model_len)
    if truncate is not None and len(ids) > truncate:
        ids = _truncate_text(tokenizer, text, ids, truncate)
    return ids


def _truncate_text(tokenizer: Any, text: str, ids: list[int], keep: int) -> list[int]:
    """The first tokens of the text, inside the special tokens the tokenizer adds around it."""
    plain: list[int] = tokenizer.encode(text, add_special_tokens=False)
    extra = len(ids) - len(plain)
    for start in range(max(extra, 0) + 1):
        if ids[start : start + len(plain)] == plain and keep > extra:
            return ids[:start] + plain[: keep - extra] + ids[start + len(plain) :]
    return ids[:keep]


def _ids(ids: list[int], i: int, limits: Limits, truncate: int | None) -> list[int]:
    if not ids:
        raise bad_request(f"'input[{i}]' is an empty array of token ids", param="input")
    check_vocab(ids, limits.vocab_size, f"input[{i}]", "input")
    if truncate is not None and len(ids) > truncate:
        return ids[-truncate:]
    if len(ids) > limits.max_model_len:
        raise _too_long(i, len(ids), limits.max_model_len)
    return ids


def _too_long(i: int, n: int, limit: int) -> ApiError:
    return ApiError(
        400,
        f"This model's maximum input length is {limit} tokens; 'input[{i}]' has {n} tokens. Shorten "
        f"it, or set 'truncate_prompt_tokens' (-1: the model's limit) to cut it",
        param="input",
        code="context_length_exceeded",
    )


def embeddings_body(model: str, vectors: list[bytes], b64: bool, prompt_tokens: int) -> bytes:
    """The response: `vectors` are little-endian float32 bytes, one per input, in input order."""
    data = [{"object": "embedding", "index": i, "embedding": _encode(v, b64)} for i, v in enumerate(vectors)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    body = {"object": "list", "data": data, "model": model, "usage": usage}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _encode(vector: bytes, b64: bool) -> str | np.ndarray:
    if b64:
        return base64.b64encode(vector).decode("ascii")
    # native float32, which orjson writes in float32's shortest form (0.0023064255, not ...5478309393)
    return np.frombuffer(vector, dtype="<f4").astype(np.float32, copy=False)
