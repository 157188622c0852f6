"""One constrained sequence's grammar state: an llguidance matcher plus how many outputs it consumed.

Invariant: the matcher has consumed exactly `seq.output_ids[:consumed]`. The engine advances it as
each token is appended (`accept`); the mask filler calls `sync` first, which consumes whatever the
engine appended since (none in the plain engine; the newest token when a pipelined engine learns it
late). A preempted or prefix-cache-resumed sequence keeps its output_ids, so it keeps its state too:
grammar state depends on the output tokens only, never on which of them have K/V in the cache.
"""

from __future__ import annotations

from typing import Any


class GrammarViolation(RuntimeError):
    """A token the grammar does not allow reached a matcher (the mask was not applied)."""


class GrammarMatcher:
    __slots__ = ("consumed", "matcher")

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher  # llguidance.LLMatcher
        self.consumed = 0

    def accept(self, token_id: int) -> None:
        self.consumed += 1
        if not self.matcher.consume_token(token_id):
            raise GrammarViolation(f"token {token_id} broke the grammar: {self.matcher.get_error()}")

    def sync(self, output_ids: list[int]) -> None:
        while self.consumed < len(output_ids):
            self.accept(output_ids[self.consumed])

    @property
    def failed(self) -> bool:
        return bool(self.matcher.is_error())
