"""How sure a ratio of two speeds is: the geometric mean of paired ratios and a bootstrap interval.

The streaming benchmarks compare two modes in back-to-back pairs (ABBA), so that the machine's drift
cancels within a pair; on a shared 2-core VM single pairs still spread +-5-15 %. Whether a run
settles a target such as "streamed / non-streamed >= 0.995" is then a question of the interval, not
of the point: a run whose interval holds the target has not told which side of it the truth is.

The interval is a percentile bootstrap over the pairs (resampled with replacement, a fixed seed so
that a JSON file's figures can be recomputed), on log ratios: a ratio and its inverse get
intervals that mirror each other.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RatioCI:
    mean: float  # geometric mean of the pairs' ratios
    low: float
    high: float
    level: float  # e.g. 0.95
    pairs: int

    def holds(self, target: float) -> bool:
        """The target lies inside the interval: this run cannot tell whether it was met."""
        return self.low <= target <= self.high

    def text(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def ratio_ci(ratios: Sequence[float], level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> RatioCI:
    """The pairs' geometric mean ratio and its `level` bootstrap interval (one pair: a point)."""
    if not ratios or any(r <= 0 for r in ratios):
        raise ValueError(f"ratios must be positive and at least one, got {list(ratios)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(logs, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    low = means[int(tail * (resamples - 1))]
    high = means[math.ceil((1 - tail) * (resamples - 1))]
    return RatioCI(math.exp(sum(logs) / n), math.exp(low), math.exp(high), level, n)
