"""Comparing two policies over seeds: paired ratios and when a difference is real."""

from __future__ import annotations

import math

import pytest

from gpuq.sim.metrics import paired_ratio


def test_the_ratio_is_the_geometric_mean_of_the_per_seed_ratios() -> None:
    result = paired_ratio([110.0, 90.0], [100.0, 100.0])
    assert result.ratio == pytest.approx(math.sqrt(1.1 * 0.9))
    assert result.pairs == 2


def test_a_consistent_difference_is_called_real() -> None:
    result = paired_ratio([101.0, 102.0, 101.5, 101.2], [100.0] * 4)
    assert result.low > 1.0
    assert result.verdict == "higher"
    assert paired_ratio([100.0] * 4, [101.0, 102.0, 101.5, 101.2]).verdict == "lower"


def test_a_difference_smaller_than_the_seeds_spread_is_the_same() -> None:
    result = paired_ratio([105.0, 96.0, 101.0], [100.0, 100.0, 100.0])
    assert result.ratio > 1.0
    assert result.low < 1.0 < result.high
    assert result.verdict == "same"


def test_one_pair_gives_no_interval_and_no_verdict() -> None:
    result = paired_ratio([120.0], [100.0])
    assert (result.ratio, result.low, result.high) == pytest.approx((1.2, 1.2, 1.2))
    assert result.verdict == "same"


def test_the_interval_widens_with_the_spread_and_narrows_with_more_seeds() -> None:
    tight = paired_ratio([101.0, 103.0], [100.0, 100.0])
    loose = paired_ratio([99.0, 105.0], [100.0, 100.0])
    more = paired_ratio([99.0, 105.0] * 4, [100.0] * 8)
    assert loose.high - loose.low > tight.high - tight.low
    assert more.high - more.low < loose.high - loose.low


@pytest.mark.parametrize(("ours", "theirs"), [([], []), ([1.0], [1.0, 2.0]), ([0.0], [1.0])])
def test_unpaired_or_non_positive_values_are_refused(
    ours: list[float], theirs: list[float]
) -> None:
    with pytest.raises(ValueError, match="paired_ratio"):
        paired_ratio(ours, theirs)
