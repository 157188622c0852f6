"""Typed readers for request-body fields: each names the field in its 400 when the type is wrong.

`null` means "not given" everywhere, as in the OpenAI API. Bools are never accepted as numbers
(JSON `true` is a Python int subclass, so it needs excluding explicitly).
"""

from __future__ import annotations

from typing import Any

from rillet.http.openai.errors import bad_request

Body = dict[str, Any]


def _type_error(name: str, expected: str, value: Any) -> Exception:
    return bad_request(
        f"'{name}' must be {expected}, got {type_name(value)}", param=name, code="invalid_type"
    )


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def opt_int(body: Body, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    # 3.0 is a valid JSON integer to many clients; 3.5 is not.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise _type_error(name, "an integer", value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise bad_request(f"'{name}' must be {bounds}, got {value}", param=name, code="invalid_value")
    return int(value)


def opt_float(body: Body, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, "a number", value)
    return float(value)


def opt_bool(body: Body, name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def opt_str(body: Body, name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _type_error(name, "a string", value)
    return value


def opt_dict(body: Body, name: str) -> dict[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error(name, "an object", value)
    return value


def opt_str_list(body: Body, name: str) -> list[str] | None:
    """A string or a list of strings (OpenAI's `stop`)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _type_error(name, "a string or an array of strings", value)
    return list(value)


def opt_int_list(body: Body, name: str) -> list[int] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise _type_error(name, "an array of integers", value)
    return list(value)


def check_vocab(ids: list[int], vocab_size: int | None, where: str, param: str) -> None:
    """A 400 naming `param` for the first id of `ids` (at `where`) outside [0, vocab_size)."""
    bad = next((t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)), None)
    if bad is not None:
        raise bad_request(f"'{where}' holds token id {bad} outside the vocabulary", param=param)

# ---- `priority` (vLLM's extension) ----------------------------------------------------------------
# The request field `priority` (vLLM's extension): an integer, lower first, default 0.
#
# Read from the chat and completions bodies, and from the Responses and Anthropic Messages bodies under
# the same name. Strict: a boolean, a number with a fraction or written as a float, or a string is a
# 400 naming the field (pydantic's lax coercion in vLLM takes "1" and 1.0; a scheduling order should
# not be guessed). Under scheduler.policy fcfs any value but 0 is a 400, as vLLM answers ("Got
# priority 1 but Priority scheduling is not enabled."): the client asked for an order it would not get.
def parse_priority(body: Body, enabled: bool) -> int:
    """`enabled`: scheduler.policy is priority."""
    value = body.get("priority")
    if value is None:
        return 0
    if not is_int(value):
        raise bad_request(
            f"'priority' must be an integer, got {type_name(value)}", param="priority", code="invalid_type"
        )
    if value and not enabled:
        raise bad_request(
            f"'priority' is {value} but priority scheduling is off on this server (scheduler.policy: "
            "fcfs); only 0 is accepted",
            param="priority",
            code="invalid_value",
        )
    return int(value)
