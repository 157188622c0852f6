"""Bodies of /tokenize and /detokenize -> their answers, or a 400 naming the field.

vLLM's shapes: `{"prompt": str, "add_special_tokens": bool, "return_token_strs": bool}` or
`{"messages": [...], "tools", "add_generation_prompt": bool}` -> `{"count", "max_model_len",
"tokens", "token_strs"?}`; `{"tokens": [int]}` -> `{"prompt": str}`. llama.cpp server's names are
accepted too, so its clients work unchanged: `content` for `prompt`, `add_special` (default false
there) for `add_special_tokens`, `with_pieces` (each token as `{"id", "piece"}`), and the
detokenized text is also sent as `content`. `model` is optional (llama.cpp has none); given, it
must name the served model or a loaded adapter (they share the tokenizer).

The ids are the ones a generation request would be given: a prompt is encoded as /v1/completions
encodes it, messages are rendered as /v1/chat/completions renders them (template, tools; a vision
model's images expanded into their image tokens).
"""

from __future__ import annotations

from typing import Any

from rillet.http.openai.chat_messages import Images, expand_prompt, parse_messages
from rillet.http.openai.errors import bad_request
from rillet.http.openai.fields import Body, check_vocab, is_int, opt_bool, type_name
from rillet.http.openai.protocol import Limits, check_model
from rillet.http.openai.tool_prompt import render_chat_ids
from rillet.http.openai.tools import parse_tools

_PROMPT_FIELDS = ("prompt", "content", "messages")


def tokenize(body: Body, tokenizer: Any, limits: Limits, images: Images | None = None) -> dict[str, Any]:
    _check_model(body, limits)
    given = [name for name in _PROMPT_FIELDS if body.get(name) is not None]
    if len(given) != 1:
        raise bad_request(
            "give exactly one of 'prompt' (or llama.cpp's 'content') and 'messages'",
            param=given[1] if len(given) > 1 else "prompt",
            code="missing_required_parameter" if not given else None,
        )
    if given[0] == "messages":
        ids = _chat_ids(body, tokenizer, limits, images)
    else:
        ids = _text_ids(body, given[0], tokenizer)
    out: dict[str, Any] = {"count": len(ids), "max_model_len": limits.max_model_len, "tokens": ids}
    if opt_bool(body, "return_token_strs"):
        out["token_strs"] = [tokenizer.id_to_token(i) for i in ids]
    if opt_bool(body, "with_pieces"):
        out["tokens"] = [{"id": i, "piece": tokenizer.decode([i], skip_special_tokens=False)} for i in ids]
    return out


def detokenize(body: Body, tokenizer: Any, limits: Limits) -> dict[str, Any]:
    _check_model(body, limits)
    ids = body.get("tokens")
    if ids is None:
        raise bad_request("you must provide 'tokens'", param="tokens", code="missing_required_parameter")
    if not isinstance(ids, list):
        raise bad_request(f"'tokens' must be an array of token ids, got {type_name(ids)}", param="tokens")
    for i, t in enumerate(ids):
        if not is_int(t):
            why = f"'tokens[{i}]' must be a token id (an integer), got {type_name(t)}"
            raise bad_request(why, param="tokens")
    check_vocab(ids, limits.vocab_size, "tokens", "tokens")
    text = tokenizer.decode(ids, skip_special_tokens=False)  # as vLLM and llama.cpp: specials stay
    return {"prompt": text, "content": text}


def _check_model(body: Body, limits: Limits) -> None:
    if body.get("model") is not None:
        check_model(body, limits)


def _text_ids(body: Body, field: str, tokenizer: Any) -> list[int]:
    text = body[field]
    if not isinstance(text, str):
        raise bad_request(f"'{field}' must be a string, got {type_name(text)}", param=field)
    special = opt_bool(body, "add_special_tokens")
    if special is None:
        # vLLM adds the model's special tokens (as /v1/completions does); llama.cpp does not
        special = opt_bool(body, "add_special")
        special = field == "prompt" if special is None else special
    return list(tokenizer.encode(text, add_special_tokens=special))


def _chat_ids(body: Body, tokenizer: Any, limits: Limits, images: Images | None) -> list[int]:
    messages = parse_messages(body.get("messages"), images)
    generation = opt_bool(body, "add_generation_prompt")
    ids = render_chat_ids(tokenizer, messages, parse_tools(body), "messages", generation is not False)
    return expand_prompt(limits.vision, ids, messages, "messages")[0]
