"""bench/bench_adaptive.py's `--measure-share` and `--measure-every`: gpuq's pacing, for a while."""

from __future__ import annotations

import pytest

import gpuq.runner.gns as gns
from bench.adaptive_runs import measuring

pytestmark = [pytest.mark.torch]


def test_inside_measuring_the_noise_is_paced_as_asked_and_after_it_as_gpuq_paces_it() -> None:
    usual = gns.measure_interval(1.0, 10.0)  # a measurement costing a tenth of a step
    assert usual == 5  # 2% of the time: one step in five
    with measuring(share=0.1, every=8):
        assert gns.measure_interval(1.0, 10.0) == 1  # 10% allows one every step
        assert gns.measure_interval(100.0, 10.0) == 8  # at least one in 8
    assert gns.measure_interval(1.0, 10.0) == usual


def test_measuring_without_values_changes_nothing_and_restores_after_an_error() -> None:
    saved = gns.MEASURE_SHARE, gns.MEASURE_EVERY
    with measuring():
        assert (gns.MEASURE_SHARE, gns.MEASURE_EVERY) == saved
    with pytest.raises(RuntimeError), measuring(share=0.5):
        raise RuntimeError("a run that fails")
    assert (gns.MEASURE_SHARE, gns.MEASURE_EVERY) == saved
