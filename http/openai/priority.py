"""The request field `priority` (vLLM's extension): an integer, lower first, default 0.

Read from the chat and completions bodies, and from the Responses and Anthropic Messages bodies under
the same name. Strict: a boolean, a number with a fraction or written as a float, or a string is a
400 naming the field (pydantic's lax coercion in vLLM takes "1" and 1.0; a scheduling order should
not be guessed). Under scheduler.policy fcfs any value but 0 is a 400, as vLLM answers ("Got
priority 1 but Priority scheduling is not enabled."): the client asked for an order it would not get.
"""

from __future__ import annotations

from rillet.http.openai.errors import bad_request
from rillet.http.openai.fields import Body, is_int, type_name


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
