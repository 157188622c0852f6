"""Chat templates: Jinja2 in a sandbox, with the globals and filters transformers gives them.

Templates come from model files, so they are untrusted code: they run in an
`ImmutableSandboxedEnvironment`, as in transformers, with `trim_blocks` / `lstrip_blocks` on so
that the same template renders byte-for-byte the same text here and there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML, used when a model ships no template.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """A template that does not compile, or that refuses (or fails on) the given messages."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body; transformers uses it for masks."""

    tags = {"generation"}  # noqa: RUF012  (jinja's own class attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own `tojson` escapes HTML characters, which would change the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def render_chat_template(
    template: jinja2.Template,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    special_tokens: Mapping[str, str | None],
    **extra: Any,
) -> str:
    """`special_tokens` are the `bos_token` / `eos_token` / ... variables; `extra` overrides them."""
    variables: dict[str, Any] = {"tools": None, "documents": None, **special_tokens, **extra}
    try:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(str(exc)) from exc
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # e.g. `str + None` inside the template
        raise ChatTemplateError(f"chat template failed on these messages: {exc}") from exc


def fold_system_message(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Leading system messages joined onto the first user message ("<system>\n\n<user>"), or
    sent as a user message when no user message follows them: for templates with no system role."""
    n = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
    if n == 0:
        return messages
    system = "\n\n".join(str(m.get("content") or "") for m in messages[:n])
    rest = messages[n:]
    if rest and rest[0].get("role") == "user":
        first = rest[0]
        content = first.get("content")
        if isinstance(content, list):  # a vision model's parts: the system text goes first
            return [{**first, "content": [{"type": "text", "text": f"{system}\n\n"}, *content]}, *rest[1:]]
        return [{**first, "content": f"{system}\n\n{content or ''}"}, *rest[1:]]
    return [{"role": "user", "content": system}, *rest]
