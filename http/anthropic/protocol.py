"""An Anthropic Messages request body -> the chat path's `GenRequest` (and a token count).

Read and used: `model`, `max_tokens` (required, as Anthropic), `messages`, `system`,
`stop_sequences`, `temperature`, `top_p`, `top_k` (the SDK passes these through `extra_body`),
`stream`, `tools`, `tool_choice`, `output_config.format` (`json_schema`: constrained as chat's
`response_format`), and the extensions `ignore_eos` and `priority` (vLLM's, scheduler.policy
priority; http/openai/fields.py). Accepted and ignored: `metadata`, `thinking`
(the model does not think), `output_config.effort`, `service_tier`, `cache_control` (the prefix
cache is automatic), `inference_geo`, `speed`. A user's `image` blocks are taken by a vision model
(http/vision/). Refused with a 400: `container`, `mcp_servers`, server tools, document blocks,
images for a text model, a final assistant message (prefill).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rillet.core.structured.spec import GrammarSpec
from rillet.http.anthropic.messages import chat_messages
from rillet.http.anthropic.tools import parse_tools
from rillet.http.openai.chat_messages import Images, expand_prompt
from rillet.http.openai.errors import bad_request, unsupported
from rillet.http.openai.fields import Body, opt_dict, type_name
from rillet.http.openai.protocol import GenRequest, Limits, chat_request, check_model
from rillet.http.openai.response_format import schema_text
from rillet.http.openai.tool_prompt import render_chat_ids

_SAMPLING = ("temperature", "top_p", "top_k", "max_tokens", "stream", "ignore_eos", "priority")
_REFUSED = ("container", "mcp_servers")


def parse_messages(body: Body, tokenizer: Any, limits: Limits, images: Images | None = None) -> GenRequest:
    lora = check_model(body, limits)
    for name in _REFUSED:
        if body.get(name) not in (None, [], {}):
            raise unsupported(name, "is not supported by this server")
    if body.get("max_tokens") is None:
        raise bad_request("max_tokens: Field required", param="max_tokens", code="missing_required_parameter")
    messages = chat_messages(body.get("system"), body.get("messages"), images)
    tools = parse_tools(body)
    grammar = _output_format(body)
    if tools is not None and tools.mode != "auto" and grammar is not None:
        raise unsupported(
            "output_config.format", "cannot be combined with a forced tool_choice (any or tool)"
        )
    sampling = {k: body[k] for k in _SAMPLING if k in body}
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_request("stop_sequences: must be an array of non-empty strings", param="stop_sequences")
        sampling["stop"] = stops
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad_request(f"metadata: must be an object, got {type_name(metadata)}", param="metadata")
    gen = chat_request(sampling, messages, tools, grammar, tokenizer, limits)
    return dataclasses.replace(gen, lora=lora)  # `sampling` holds no `model`


def count_tokens(body: Body, tokenizer: Any, limits: Limits, images: Images | None = None) -> int:
    """POST /v1/messages/count_tokens: the prompt's tokens as /v1/messages would build it (its
    images' tokens included)."""
    check_model(body, limits)
    messages = chat_messages(body.get("system"), body.get("messages"), images)
    ids = render_chat_ids(tokenizer, messages, parse_tools(body))
    return len(expand_prompt(limits.vision, ids, messages, "messages")[0])


def _output_format(body: Body) -> GrammarSpec | None:
    config = opt_dict(body, "output_config")
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    where = "output_config.format"
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad_request(f"{where}: must be an object of type 'json_schema'", param=where)
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise bad_request(
            f"{where}.schema: must be a JSON Schema object, got {type_name(schema)}", param=f"{where}.schema"
        )
    return GrammarSpec("json_schema", schema_text(schema, f"{where}.schema"), param=f"{where}.schema")
