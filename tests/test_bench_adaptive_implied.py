"""bench/bench_adaptive.py's implied noise scales: Pollux's efficiency read backwards."""

from __future__ import annotations

import math

import pytest

from bench.adaptive_runs import Outcome
from bench.bench_adaptive import SETTINGS, implied_noise_scales

pytestmark = [pytest.mark.torch]


def run(batch: int, samples_to_target: int, rule: str = "") -> Outcome:
    """A fixed run validated every 100 samples, its loss falling to the MLP's target."""
    target = SETTINGS["mlp"].target
    counts = list(range(100, samples_to_target + 1, 100))
    losses = [target + 1.0 - n / samples_to_target for n in counts]  # target at the last
    done = Outcome("mlp", batch, True, 1.0, 1.0, samples_to_target, 1, losses[-1])
    done.losses, done.sample_counts, done.rule = losses, counts, rule
    return done


def test_a_size_needing_twice_m0s_samples_at_four_times_the_batch_implies_phi_2_m0() -> None:
    # Efficiency (phi + M0) / (phi + M) = 1/2 at M = 4 M0 (64) gives phi = 2 M0 = 32.
    implied = implied_noise_scales("mlp", [run(16, 1000), run(64, 2000)])
    at_target = implied[round(SETTINGS["mlp"].target, 4)]
    assert at_target == {64: pytest.approx(32.0)}


def test_no_cost_in_samples_is_an_unbounded_noise_scale_and_other_rules_are_left_out() -> None:
    runs = [run(16, 1000), run(32, 1000), run(64, 500, rule="linear")]
    implied = implied_noise_scales("mlp", runs)
    assert all(row == {32: math.inf} for row in implied.values())


def test_a_size_that_never_reaches_a_loss_is_left_out_there() -> None:
    never = run(128, 1000)
    never.losses = [loss + 2.0 for loss in never.losses]  # stays above every loss looked at
    implied = implied_noise_scales("mlp", [run(16, 1000), run(64, 2000), never])
    assert all(128 not in row for row in implied.values())


def test_with_several_seeds_a_size_counts_the_median_of_its_runs_samples() -> None:
    # M0's three seeds need 900, 1000 and 1300 samples (median 1000); 64's 1800, 2000, 2100.
    m0 = [run(16, n) for n in (900, 1000, 1300)]
    larger = [run(64, n) for n in (1800, 2000, 2100)]
    implied = implied_noise_scales("mlp", [*m0, *larger])
    assert implied[round(SETTINGS["mlp"].target, 4)] == {64: pytest.approx(32.0)}
