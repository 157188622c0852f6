"""How JSON may be laid out in constrained outputs: `structured.whitespace`.

  flexible (default): newlines and indentation the way models write JSON, bounded: each gap
      between two JSON lexemes holds 1-32 spaces or tabs, or one line break with at most 4 blanks
      before it and 32 of indentation after (8 levels of 4 spaces): at most 38 bytes, never two
      line breaks. Separators are plain "," and ":" so that ",\\n" (pretty JSON) can be written;
      the gaps supply the spaces of ", " and ": ".
  compact: one line with ", " and ": ", no other whitespace (the layout before issue 26).

A ban on whitespace did not stop floods, it caused them: a model that wants to write `{\\n` under a
compact grammar was left with only off-distribution tokens (`{", ": 10000000…` until max_tokens,
on the default model). The bound holds at token level too (a vocabulary token of 80 spaces is
masked once it would overflow its gap): llguidance matches the pattern at most once per gap
("single-match skip lexemes"), which needs llguidance >= 1.8.0; older versions would silently
treat the pattern as unbounded, so they fall back to compact (`json_options`).
Torch- and llguidance-free: the HTTP layer builds tool-call grammars with the same options.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Literal

log = logging.getLogger(__name__)

WhitespaceMode = Literal["flexible", "compact"]
GAP_BYTES = 38  # the most whitespace one gap may hold under flexible (4 + "\r\n" + 32)
FLEXIBLE: dict[str, str | bool] = {
    "item_separator": ",",
    "key_separator": ":",
    "whitespace_pattern": r"[\x20\x09]{1,32}|[\x20\x09]{0,4}\x0D?\x0A[\x20\x09]{0,32}",
}
COMPACT: dict[str, str | bool] = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
BOUNDED_SINCE = (1, 8, 0)  # llguidance: whitespace_pattern matched once per gap


def _installed_version() -> tuple[int, ...] | None:
    try:
        text = importlib.metadata.version("llguidance")
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def json_options(mode: WhitespaceMode) -> dict[str, str | bool]:
    """llguidance's JSON options for `mode` (a copy). flexible needs the bound to hold: on an
    llguidance that cannot bound it, compact is used instead, with a warning."""
    if mode == "compact":
        return dict(COMPACT)
    version = _installed_version()
    if version is not None and version < BOUNDED_SINCE:
        log.warning(
            "structured.whitespace flexible needs llguidance >= %s (installed: %s): using compact",
            ".".join(map(str, BOUNDED_SINCE)),
            ".".join(map(str, version)),
        )
        return dict(COMPACT)
    return dict(FLEXIBLE)
