"""The streaming benchmarks' interval on a paired ratio (bench/lib/ratio_ci.py)."""

from __future__ import annotations

import math
import random

import pytest

from bench.lib.ratio_ci import ratio_ci


def test_identical_pairs_give_a_point() -> None:
    ci = ratio_ci([0.99] * 8)
    assert ci.low == pytest.approx(0.99) and ci.high == pytest.approx(0.99) and ci.mean == pytest.approx(0.99)
    assert ci.pairs == 8 and not ci.holds(0.995)


def test_the_mean_is_geometric_and_a_ratio_and_its_inverse_mirror() -> None:
    ratios = [0.9, 1.1, 0.95, 1.02, 0.98, 1.07]
    ci, inverse = ratio_ci(ratios), ratio_ci([1 / r for r in ratios])
    assert ci.mean == pytest.approx(math.prod(ratios) ** (1 / len(ratios)))
    assert inverse.low == pytest.approx(1 / ci.high) and inverse.high == pytest.approx(1 / ci.low)


def test_the_interval_covers_the_truth_about_as_often_as_its_level() -> None:
    """Pairs drawn around a known ratio (log-normal, the VM's +-5 % a pair): a 90 % interval must
    hold it in most of 200 runs of 14 pairs. The bound is far from the expected 180 (percentile
    bootstrap runs a little narrow at n = 14): the seeds are fixed, so it cannot flake."""
    rng = random.Random(1)
    truth = 0.99
    covered = 0
    for run in range(200):
        pairs = [truth * math.exp(rng.gauss(0, 0.05)) for _ in range(14)]
        covered += ratio_ci(pairs, level=0.9, resamples=2000, seed=run).holds(truth)
    assert 150 <= covered <= 200


def test_the_interval_narrows_with_more_pairs() -> None:
    rng = random.Random(2)
    pairs = [0.99 * math.exp(rng.gauss(0, 0.05)) for _ in range(200)]
    few, many = ratio_ci(pairs[:14]), ratio_ci(pairs)
    assert many.high - many.low < (few.high - few.low) / 2


@pytest.mark.parametrize(("ratios", "level"), [([], 0.95), ([1.0, -0.5], 0.95), ([1.0], 1.0)])
def test_bad_input_is_refused(ratios: list[float], level: float) -> None:
    with pytest.raises(ValueError):
        ratio_ci(ratios, level=level)
