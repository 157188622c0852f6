"""OpenAI response bodies of a finished request: chat.completion and text_completion objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rillet.core.sequence import TokenLogprob
from rillet.http.openai.chunks import Usage
from rillet.http.openai.logprobs import CompletionLogprobs, TokenTexts, chat_entries, merge_columns
from rillet.http.openai.tool_calls import new_call_id, parse_all


@dataclass
class ChoiceResult:
    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # of prompt tokens 1.. (choice 0 of a prompt)
    finish_reason: str | None = None
    stop_str: str | None = None  # the stop string that ended it, if one did

    @property
    def text(self) -> str:
        return "".join(self.texts)


def chat_body(
    request_id: str,
    created: int,
    model: str,
    results: list[ChoiceResult],
    usage: Usage,
    texts: TokenTexts,
    tools: bool = False,
    max_calls: int | None = None,
) -> dict[str, Any]:
    """`tools`: tools were offered, so each answer is read for tool calls (tool_calls.py), at most
    `max_calls` of them (None: any number; parallel_tool_calls false: 1)."""
    choices = []
    for i, r in enumerate(results):
        lps = {"content": chat_entries(r.logprobs, texts)} if r.logprobs is not None else None
        message, finish = _message(r, tools, max_calls)
        choices.append({"index": i, "message": message, "logprobs": lps, "finish_reason": finish})
    return _envelope(request_id, "chat.completion", created, model, choices, usage)


def _message(r: ChoiceResult, tools: bool, max_calls: int | None) -> tuple[dict[str, Any], str | None]:
    """Only whole calls are calls: one cut by max_tokens is left out (its finish stays `length`)."""
    if not tools:
        return {"role": "assistant", "content": r.text}, r.finish_reason
    parsed = parse_all(r.text, max_calls)
    whole = parsed.complete()
    if not whole:
        return {"role": "assistant", "content": parsed.content}, r.finish_reason
    calls = [
        {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": args}}
        for name, args in whole
    ]
    content = parsed.content.strip() or None
    finish = "tool_calls" if r.finish_reason == "stop" and not parsed.dropped else r.finish_reason
    return {"role": "assistant", "content": content, "tool_calls": calls}, finish


def completion_body(
    request_id: str,
    created: int,
    model: str,
    results: list[ChoiceResult],
    usage: Usage,
    texts: TokenTexts,
    echo_texts: list[str] | None,
    prompts: list[list[int]] | None = None,
) -> dict[str, Any]:
    """`prompts`: with echo and logprobs, the prompts' ids, whose columns lead each choice's."""
    choices = []
    for i, r in enumerate(results):
        prefix = echo_texts[i // usage.n] if echo_texts is not None else ""
        lps = None
        if r.logprobs is not None:
            columns = CompletionLogprobs()
            parts = []
            if prompts is not None:  # the prompt group's choice 0 carries its prompt's logprobs
                scored = results[i - i % usage.n].prompt_logprobs or []
                parts.append(columns.prompt_columns(prompts[i // usage.n], scored, texts))
            parts.append(columns.columns(r.logprobs, texts))
            lps = merge_columns(parts)
        choices.append(
            {"index": i, "text": prefix + r.text, "logprobs": lps, "finish_reason": r.finish_reason}
        )
    return _envelope(request_id, "text_completion", created, model, choices, usage)


def _envelope(
    request_id: str, obj: str, created: int, model: str, choices: list[dict[str, Any]], usage: Usage
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage.body(),
    }
