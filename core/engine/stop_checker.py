"""Stop strings over streamed text: never release text past a stop, release held text once it is safe.

Invariant: `_pending` is the longest suffix of the text seen so far that is a proper prefix of some stop
string (so it is shorter than the longest stop string); everything before it has been released.
A stop string therefore completes only in text that arrived in the latest `feed`.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...]) -> None:
        assert all(stops), "stop strings must be non-empty"
        self.stops = stops
        self._pending = ""

    @property
    def pending(self) -> str:
        return self._pending

    def feed(self, text: str, armed: bool = True) -> tuple[str, str | None]:
        """Appends `text`; returns (text safe to release, the stop string matched or None).

        On a match the released text ends right before the earliest-starting stop string that ends in
        `text`, and whatever follows it is dropped. Unarmed (before min_tokens), matches are ignored but
        prefixes are still held, so a stop string that completes once armed can still be cut.
        """
        old_len = len(self._pending)
        buf = self._pending + text
        if armed:
            hit = self._earliest(buf, old_len)
            if hit is not None:
                self._pending = ""
                return buf[: hit[0]], hit[1]
        keep = self._held_len(buf)
        self._pending = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        """Releases the held text (the stream ended without completing a stop string)."""
        out, self._pending = self._pending, ""
        return out

    def _earliest(self, buf: str, old_len: int) -> tuple[int, str] | None:
        """Earliest (then shortest) stop string in `buf` that ends past `old_len`."""
        best: tuple[int, str] | None = None
        for stop in self.stops:
            pos = buf.find(stop, max(0, old_len - len(stop) + 1))
            if pos >= 0 and (best is None or (pos, len(stop)) < (best[0], len(best[1]))):
                best = (pos, stop)
        return best

    def _held_len(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        held = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buf)), held, -1):
                if buf.endswith(stop[:k]):
                    held = k
                    break
        return held
