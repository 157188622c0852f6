"""A Responses request body -> the chat path's `GenRequest`, plus what the response object repeats.

Read and used: `model`, `input`, `instructions` (a system message first; not carried over by
`previous_response_id`, as OpenAI), `max_output_tokens`, `temperature`, `top_p`, `tools`,
`tool_choice`, `parallel_tool_calls`, `text.format`, `stream`, `store`, `previous_response_id`,
`metadata` (echoed). Extensions a client may add (vLLM's): `top_k`, `seed`, `stop`, `logit_bias`,
`ignore_eos`, `priority` (scheduler.policy priority; http/openai/fields.py).
Accepted and ignored (the engine has nothing they could change): `reasoning`, `include` (but not
`message.output_text.logprobs`), `truncation`, `text.verbosity`, `user`, `service_tier`,
`safety_identifier`, `prompt_cache_key`, `prompt_cache_retention`, `max_tool_calls`,
`stream_options`. Refused with a 400 naming them: `background: true`, `conversation`, `prompt`,
`top_logprobs` > 0, logprobs through `include`, built-in tools, input parts other than text and a
user's `input_image` (taken by a vision model, http/vision/).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rillet.http.openai.chat_messages import Images
from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import Body, opt_bool, opt_dict, opt_int, opt_str, type_name
from rillet.http.openai.protocol import GenRequest, Limits, chat_request, check_model
from rillet.http.responses.input_list import input_items
from rillet.http.responses.items import input_messages
from rillet.http.responses.text_format import parse_text_format
from rillet.http.responses.tools import parse_tools, tools_echo

# Sampling fields handed to the chat path under the same names (max_output_tokens as max_tokens).
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "logit_bias",
    "ignore_eos",
    "max_output_tokens",
    "stream",
    "priority",
)
_REFUSED = ("conversation", "prompt")
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass(frozen=True)
class ResponsesRequest:
    gen: GenRequest
    messages: list[dict[str, Any]]  # the conversation so far in chat shape, instructions excluded
    store: bool
    echo: dict[str, Any]  # fields of the response object that repeat the request
    inputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # input_list.py's items


def previous_response_id(body: Body) -> str | None:
    return opt_str(body, "previous_response_id")


def parse_responses(
    body: Body,
    tokenizer: Any,
    limits: Limits,
    previous: list[dict[str, Any]] | None = None,
    images: Images | None = None,
) -> ResponsesRequest:
    """`previous`: the stored conversation of `previous_response_id` (looked up by the caller; its
    images are kept in it). `images`: the request's own, decoded (http/vision/loader.py)."""
    lora = check_model(body, limits)
    _refuse(body)
    instructions = opt_str(body, "instructions")
    messages = [*(previous or []), *input_messages(body.get("input"), images)]
    tools = parse_tools(body)
    grammar = parse_text_format(body)
    if tools is not None and tools.mode != "auto" and grammar is not None:
        raise unsupported("text.format", "cannot be combined with tool_choice 'required' or a named function")
    prompt = [{"role": "system", "content": instructions}, *messages] if instructions else messages
    sampling = {k: body[k] for k in _SAMPLING if k in body}
    gen = chat_request(
        sampling, prompt, tools, grammar, tokenizer, limits, "max_output_tokens", prompt_field="input"
    )
    gen = dataclasses.replace(gen, lora=lora)  # `sampling` holds no `model`
    store = opt_bool(body, "store") is not False
    inputs = input_items(body["input"]) if store else []
    return ResponsesRequest(gen, messages, store, _echo(body, instructions), inputs)


def _refuse(body: Body) -> None:
    for name in _REFUSED:
        if body.get(name) not in (None, "", {}):
            raise unsupported(name, "is not supported by this server (use previous_response_id)")
    if opt_bool(body, "background"):
        raise unsupported("background", "(background responses) is not supported by this server")
    if opt_int(body, "top_logprobs", 0, 20):
        raise unsupported("top_logprobs", "(logprobs) is not supported on /v1/responses")
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list) or not all(isinstance(v, str) for v in include)
    ):
        raise bad_request(f"'include' must be an array of strings, got {type_name(include)}", param="include")
    if include and _LOGPROBS_INCLUDE in include:
        raise unsupported("include", f"{_LOGPROBS_INCLUDE!r} (logprobs) is not supported on /v1/responses")
    metadata = opt_dict(body, "metadata")
    if metadata is not None and not all(isinstance(v, str) for v in metadata.values()):
        raise bad_request("'metadata' values must be strings", param="metadata")
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise bad_request(f"'reasoning' must be an object, got {type_name(reasoning)}", param="reasoning")


def _echo(body: Body, instructions: str | None) -> dict[str, Any]:
    text = body.get("text") if isinstance(body.get("text"), dict) else None
    fmt = (text or {}).get("format") or {"type": "text"}
    choice = body.get("tool_choice")
    return {
        "instructions": instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning"),
        "store": body.get("store") is not False,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": fmt},
        "tool_choice": choice if choice is not None else "auto",
        "tools": tools_echo(body),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "user": body.get("user"),
    }
