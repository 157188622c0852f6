"""What a request asks the output to match: built by the HTTP layer, compiled by the engine.

A spec is plain data (no llguidance, no torch), so it can travel inside `SamplingParams`. Equal
specs share one compiled grammar in the cache (`param` is only for error messages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rillet.core.errors import RequestError

GrammarKind = Literal["json_schema", "json_object", "lark", "regex"]


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    # json_schema: the schema as JSON text (key order kept: it is the property order of the output);
    # lark: an llguidance Lark grammar; regex: a regular expression the whole output matches;
    # json_object: "" (any JSON object).
    source: str = ""
    param: str = field(default="response_format", compare=False)  # request field named in errors


class GrammarError(RequestError):
    """A grammar that cannot be compiled (invalid, unsupported, too complex): the client's fault."""


class GrammarUnavailable(GrammarError):
    """This server cannot constrain outputs (the optional grammar engine is not installed)."""


INSTALL_HINT = (
    "structured outputs (response_format, tool_choice 'required' or a named function) need the "
    "optional package 'llguidance' on the server: pip install 'rillet[structured]' (make install does it)"
)
