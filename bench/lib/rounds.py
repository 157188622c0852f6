"""Measurements repeated in rounds: every mode's server started once a round, in turn (A B A B),
so that a host drifting over the minutes a run takes shifts every mode alike, where one start a
mode (A A B B) puts the drift between the modes.

`merge` adds up the rounds' rows by their key (token counts, wall seconds, counters); a bench
then derives its rates from the sums and lists each round's ratio beside the merged one
(`per_round`), so a reader sees the spread that one figure hides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Row = dict[str, Any]


def merge(rounds: Sequence[Sequence[Row]], key: Sequence[str], sums: Sequence[str]) -> list[Row]:
    """One row per key: the key's columns, and each of `sums` added up over the rounds."""
    merged: dict[tuple[Any, ...], Row] = {}
    for rows in rounds:
        for r in rows:
            k = tuple(r[c] for c in key)
            m = merged.setdefault(k, {**{c: r[c] for c in key}, **{s: 0 for s in sums}})
            for s in sums:
                m[s] += r[s]
    return list(merged.values())


def per_round(merged: list[Row], rounds: Sequence[Sequence[Row]], key: Sequence[str], column: str) -> None:
    """Sets `<column>_rounds` on each merged row: that column's value in each round (None where a
    round has no such row or no value)."""
    for m in merged:
        k = tuple(m[c] for c in key)
        got: list[Any] = []
        for rows in rounds:
            match = [r.get(column) for r in rows if tuple(r[c] for c in key) == k]
            got.append(match[0] if match else None)
        m[f"{column}_rounds"] = got
