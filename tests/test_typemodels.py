"""A job's model per GPU type: measured where it ran, bootstrapped elsewhere (Sia 3.1)."""

from __future__ import annotations

import pytest

from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.typemodels import Fitted, bootstrap, scale_perf

PERF = PerfParams(0.05, 0.002, 0.2, 0.01, 0.05, 0.005, 1.5)
SPEEDS = {"T4": 1.0, "RTX2080Ti": 2.0, "A100": 4.0}


def test_scaling_a_model_scales_every_step_time_by_the_factor() -> None:
    grad = GradParams(1.0, 1.0)
    fast, slow = GoodputFunction(PERF, grad, 32), GoodputFunction(scale_perf(PERF, 2.5), grad, 32)
    for nodes, replicas, local in [(1, 1, 32), (1, 4, 64), (2, 8, 16)]:
        assert slow.step_time(nodes, replicas, local, 0) == pytest.approx(
            2.5 * fast.step_time(nodes, replicas, local, 0)
        )
    with pytest.raises(ValueError, match="positive"):
        scale_perf(PERF, 0.0)


def test_a_type_without_runs_borrows_the_widest_runs_model_scaled_by_speed() -> None:
    models = bootstrap({"A100": Fitted(PERF, 8), "T4": Fitted(PERF, 1)}, SPEEDS)
    assert models["A100"] == (PERF, True)
    # T4 ran on one GPU only: its scaling comes from the A100 runs, 4x slower.
    assert models["T4"] == (scale_perf(PERF, 4.0), False)
    assert models["RTX2080Ti"] == (scale_perf(PERF, 2.0), False)


def test_a_type_where_the_job_ran_on_several_gpus_keeps_its_own_fit() -> None:
    other = scale_perf(PERF, 3.0)
    models = bootstrap({"A100": Fitted(PERF, 8), "T4": Fitted(other, 2)}, SPEEDS)
    assert models["T4"] == (other, True)
    assert models["RTX2080Ti"] == (scale_perf(PERF, 2.0), False)  # from the widest


def test_single_gpu_fits_only_are_used_where_measured_and_scaled_elsewhere() -> None:
    models = bootstrap({"T4": Fitted(PERF, 1)}, SPEEDS)
    assert models["T4"] == (PERF, True)
    assert models["A100"] == (scale_perf(PERF, 0.25), False)


def test_a_job_with_no_fit_has_no_model_anywhere() -> None:
    assert bootstrap({}, SPEEDS) == {}


def test_ties_between_equally_wide_types_go_to_the_first_named() -> None:
    models = bootstrap({"A100": Fitted(PERF, 4), "T4": Fitted(scale_perf(PERF, 5.0), 4)}, SPEEDS)
    assert models["RTX2080Ti"] == (scale_perf(scale_perf(PERF, 5.0), 0.5), False)
