"""OpenAI request bodies -> a validated `GenRequest` (token ids + SamplingParams), or a 400.

All input checking happens here, before anything reaches the engine. Unknown top-level fields
are ignored (as OpenAI and vLLM do), but fields we know and do not support (other servers' too:
compat/refused.py) are rejected naming the parameter, so a client never silently gets behaviour it
did not ask for. vLLM's structured outputs are served (compat/guided.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, Literal

from rillet.core.sampling_params import MAX_LOGPROBS, SamplingParams
from rillet.core.structured.json_style import FLEXIBLE
from rillet.core.structured.spec import GrammarSpec
from rillet.core.vision.front import VisionFront
from rillet.http.openai.chat_messages import Images, expand_prompt, parse_messages
from rillet.http.openai.compat.guided import parse_guided
from rillet.http.openai.compat.refused import refuse_extensions
from rillet.http.openai.errors import bad_request, model_not_found, unsupported
from rillet.http.openai.fields import (
    Body,
    check_vocab,
    is_int,
    opt_bool,
    opt_dict,
    opt_int,
    opt_str,
    parse_priority,
    type_name,
)
from rillet.http.openai.response_format import parse_response_format
from rillet.http.openai.sampling import fit_context, sampling_params
from rillet.http.openai.tool_prompt import render_chat_ids
from rillet.http.openai.tools import ToolSetup, parse_tools

Kind = Literal["chat", "completion"]
# Rejected whenever present and not null / empty: they would change the answer's meaning.
_UNSUPPORTED = (
    "functions",
    "function_call",
    "audio",
    "prediction",
    "web_search_options",
)


@dataclass(frozen=True)
class Limits:
    """What a request is checked against: the served model and the server's caps."""

    model_name: str
    max_model_len: int
    max_tokens_cap: int
    default_max_tokens: int
    max_n: int
    vocab_size: int | None = None
    # Completions may batch prompts (one engine request each); more than the waiting queue holds
    # could never be admitted, so that is a 400, not an endless 429.
    max_prompts: int = 1024
    # JSON layout of forced tool calls (core/structured/json_style.py; the engine's grammars
    # use the same) and the cap on parallel calls (structured.max_tool_calls)
    json_options: dict[str, str | bool] = dataclasses.field(default_factory=lambda: dict(FLEXIBLE))
    max_tool_calls: int = 8
    # a constrained request that sets no penalty gets this repetition penalty (structured.repetition_penalty)
    grammar_repetition_penalty: float = 1.0
    # the LoRA adapters a request may name as `model` (the engine's live registry: adapters load
    # and unload while serving)
    adapters: Container[str] = frozenset()
    priorities: bool = False  # scheduler.policy priority: a request's `priority` other than 0 is taken
    vision: VisionFront | None = None  # a vision-language model's image front end (engine.vision)


@dataclass(frozen=True)
class GenRequest:
    kind: Kind
    prompts: list[list[int]]  # one engine request per prompt; choice index = prompt * n + i
    params: list[SamplingParams]  # per prompt (the default max_tokens depends on its length)
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None  # top-N alternatives per token when logprobs were asked for
    echo_texts: list[str] | None  # completions with echo: the prompt text to prepend per prompt
    grammar: GrammarSpec | None = None  # what every output must match (also in each params)
    tools: ToolSetup | None = None  # chat with tools offered: answers are read for tool calls
    # tool_choice auto: the grammar `required` would use, compiled only to check the tools' schemas
    tool_check: GrammarSpec | None = None
    lora: str | None = None  # the LoRA adapter `model` named (None: the base model)
    priority: int = 0  # lower runs first (scheduler.policy priority)
    mm: object | None = None  # a vision model's image payload for the engine (NewRequest.mm)

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def max_tool_calls(self) -> int | None:
        """Calls an answer may carry: one with parallel_tool_calls false, else any number (a
        forced call's grammar bounds its own: structured.max_tool_calls)."""
        return 1 if self.tools is not None and not self.tools.parallel else None


def parse_chat(body: Body, tokenizer: Any, limits: Limits, images: Images | None = None) -> GenRequest:
    _check_common(body, limits)
    tools = parse_tools(body)
    grammar = _output_format(body)
    if tools is not None and tools.mode != "auto" and grammar is not None:
        field = "response_format" if grammar.param.startswith("response_format") else grammar.param
        raise unsupported(field, "cannot be combined with tool_choice 'required' or a named function")
    messages = parse_messages(body.get("messages"), images)
    logprobs = _chat_logprobs(body)
    if tools is not None and logprobs is not None:
        raise unsupported("logprobs", "together with 'tools' is not supported")
    max_tokens_field = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    return chat_request(body, messages, tools, grammar, tokenizer, limits, max_tokens_field, logprobs)


def chat_request(
    body: Body,
    messages: list[dict[str, Any]],
    tools: ToolSetup | None,
    grammar: GrammarSpec | None,
    tokenizer: Any,
    limits: Limits,
    max_tokens_field: str = "max_tokens",
    logprobs: int | None = None,
    prompt_field: str = "messages",
) -> GenRequest:
    """The chat path from parsed parts: the chat template, tool prompt and grammar, sampling.

    Every front end that speaks in messages ends here (chat, Responses, Anthropic Messages): `body`
    holds the sampling fields under the chat names (`temperature`, `stop`, `max_tokens_field`, ...),
    `messages` the turns in chat_messages.py's shape. A forced tool call (`required`, named) takes
    the place of `grammar`, which the caller has checked is None then.
    """
    if tools is not None and tools.mode != "auto":
        grammar = tools.grammar(limits.json_options, limits.max_tool_calls)
    ids = render_chat_ids(tokenizer, messages, tools, prompt_field)
    ids, mm = expand_prompt(limits.vision, ids, messages, prompt_field)
    gen = _build("chat", body, [ids], prompt_field, max_tokens_field, logprobs, None, limits, grammar)
    check = (
        ToolSetup(tools.tools, "required", None, False).grammar(limits.json_options, 1)
        if tools and tools.mode == "auto"
        else None
    )
    return dataclasses.replace(gen, tools=tools, tool_check=check, mm=mm)


def parse_completion(body: Body, tokenizer: Any, limits: Limits) -> GenRequest:
    _check_common(body, limits)
    if body.get("suffix") is not None:
        raise unsupported("suffix", "(insertion after the completion) is not supported")
    for name in ("tools", "tool_choice", "parallel_tool_calls"):
        if body.get(name) not in (None, [], {}):
            raise unsupported(name, "is a chat completions parameter")
    logprobs = opt_int(body, "logprobs", 0, MAX_LOGPROBS)
    echo = bool(opt_bool(body, "echo"))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > limits.max_prompts and not is_int(prompt[0]):
        raise bad_request(
            f"'prompt' holds {len(prompt)} prompts; at most {limits.max_prompts} per request",
            param="prompt",
        )
    prompts, texts = _completion_prompts(prompt, tokenizer, limits.vocab_size)
    prompts = [expand_prompt(limits.vision, p, [], "prompt")[0] for p in prompts]  # no placeholders
    if echo:
        texts = [t if t is not None else tokenizer.decode(ids) for ids, t in zip(prompts, texts, strict=True)]
    echo_texts = [t or "" for t in texts] if echo else None
    grammar = _output_format(body)
    gen = _build("completion", body, prompts, "prompt", "max_tokens", logprobs, echo_texts, limits, grammar)
    if echo and logprobs is not None:  # the echoed prompt's tokens get theirs too (legacy completions)
        if gen.stream:
            raise unsupported("echo", "together with 'logprobs' is supported without 'stream' only")
        params = [dataclasses.replace(p, prompt_logprobs=logprobs) for p in gen.params]
        gen = dataclasses.replace(gen, params=params)
    return gen


# ---- shared --------------------------------------------------------------------------------------


def _output_format(body: Body) -> GrammarSpec | None:
    """`response_format`, or vLLM's structured outputs (guided.py): one of them."""
    fmt, guided = parse_response_format(body), parse_guided(body)
    if fmt is not None and guided is not None:
        raise bad_request(f"'{guided.param}' cannot be combined with 'response_format'", param=guided.param)
    return fmt or guided


def _check_common(body: Body, limits: Limits) -> None:
    check_model(body, limits)
    refuse_extensions(body)
    for name in _UNSUPPORTED:
        if body.get(name) not in (None, [], {}):
            raise unsupported(name)
    if body.get("modalities") not in (None, ["text"]):
        raise unsupported("modalities", 'other than ["text"] is not supported')
    opt_str(body, "user")


def check_model(body: Body, limits: Limits) -> str | None:
    """`model` is given, a string, and the served model's name or a loaded LoRA adapter's (else a
    400 or 404). Returns the adapter's name (None: the base model)."""
    model = body.get("model")
    if model is None:
        raise bad_request(
            "you must provide a model parameter", param="model", code="missing_required_parameter"
        )
    if not isinstance(model, str):
        raise bad_request(
            f"'model' must be a string, got {type_name(model)}", param="model", code="invalid_type"
        )
    if model == limits.model_name:
        return None
    if model not in limits.adapters:
        raise model_not_found(model)
    return model


def _chat_logprobs(body: Body) -> int | None:
    wanted = opt_bool(body, "logprobs")
    top = opt_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not wanted:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
    return (top or 0) if wanted else None


def _build(
    kind: Kind,
    body: Body,
    prompts: list[list[int]],
    prompt_field: str,
    max_tokens_field: str,
    logprobs: int | None,
    echo_texts: list[str] | None,
    limits: Limits,
    grammar: GrammarSpec | None = None,
) -> GenRequest:
    n = opt_int(body, "n", 1, limits.max_n) or 1
    priority = parse_priority(body, limits.priorities)
    best_of = opt_int(body, "best_of")
    if best_of is not None and best_of != n:
        raise unsupported("best_of", "other than n is not supported")
    stream = bool(opt_bool(body, "stream"))
    options = opt_dict(body, "stream_options")
    if options is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request(
            "'stream_options.include_usage' must be a boolean", param="stream_options.include_usage"
        )
    max_tokens = opt_int(body, max_tokens_field, 1, limits.max_tokens_cap)
    base = sampling_params(body, logprobs, grammar, limits.vocab_size, limits.grammar_repetition_penalty)
    params = [
        fit_context(
            base,
            len(p),
            max_tokens,
            prompt_field,
            max_tokens_field,
            limits.max_model_len,
            limits.default_max_tokens,
        )
        for p in prompts
    ]
    model = body.get("model")
    lora = model if isinstance(model, str) and model != limits.model_name else None  # checked before
    return GenRequest(
        kind,
        prompts,
        params,
        n,
        stream,
        bool(include_usage),
        logprobs,
        echo_texts,
        grammar,
        lora=lora,
        priority=priority,
    )


def _completion_prompts(
    value: Any, tokenizer: Any, vocab_size: int | None
) -> tuple[list[list[int]], list[str | None]]:
    """prompt: a string, strings, token ids, or lists of token ids -> (ids per prompt, text or None)."""
    if value is None:
        raise bad_request("you must provide a prompt", param="prompt", code="missing_required_parameter")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise bad_request("'prompt' must be a string, an array of strings or of token ids", param="prompt")
    if all(isinstance(v, str) for v in value):
        texts: list[str | None] = list(value)
        return [tokenizer.encode(t) for t in value], texts
    if all(is_int(v) for v in value):
        value = [value]
    if not all(isinstance(p, list) and p and all(is_int(t) for t in p) for p in value):
        raise bad_request("'prompt' must be a string, an array of strings or of token ids", param="prompt")
    for ids in value:
        check_vocab(ids, vocab_size, "prompt", "prompt")
    return [list(p) for p in value], [None] * len(value)
