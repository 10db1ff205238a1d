"""The goodput model (`gpuq.goodput`): Pollux's equations as implemented in adaptdl.

Efficiency and the AdaScale gain, the step-time model, the batch-size search,
the fit of the step-time model to measurements, and the speedups a policy sees.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq import goodput
from gpuq.goodput import (
    FloatArray,
    GoodputFunction,
    GradParams,
    IntArray,
    PerfParams,
    SpeedupFunction,
    adascale_gain,
    efficiency,
    fit_one_replica,
    fit_perf_params,
)

# A compute-bound job whose sync costs more across nodes than within one.
PERF = PerfParams(
    alpha_c=0.03, beta_c=0.002, alpha_n=0.08, beta_n=0.01, alpha_r=0.02, beta_r=0.002, gamma=2.0
)
# Sync that costs (almost) nothing: every extra GPU is pure gain.
SCALABLE = PerfParams(0.03, 0.002, 1e-8, 1e-8, 1e-8, 1e-8, 1.0)
NOISY = GradParams(sqr=1.0, var=100.0)  # PGNS = 100 * M0: large batches stay efficient
QUIET = GradParams(sqr=1.0, var=1e-6)  # PGNS ~ 0: every sample past M0 is wasted
M0 = 128

positive = st.floats(1e-6, 1e3)
perf_params = st.builds(
    PerfParams, positive, positive, positive, positive, positive, positive, st.floats(1.0, 10.0)
)
grad_params = st.builds(GradParams, st.floats(0.0, 1e3), st.floats(0.0, 1e3))


# --- Statistical efficiency and the AdaScale gain ------------------------------------


@pytest.mark.parametrize("grad", [NOISY, QUIET, GradParams(0.0, 1.0), GradParams(0.0, 0.0)])
def test_efficiency_is_one_at_the_initial_batch_size(grad: GradParams) -> None:
    assert efficiency(grad, M0, M0) == pytest.approx(1.0, abs=1e-12)


@given(grad_params, st.integers(1, 4096), st.floats(1.0, 1e3), st.floats(1.0, 1e3))
def test_efficiency_never_grows_with_the_batch_size(
    grad: GradParams, m0: int, scale_a: float, scale_b: float
) -> None:
    small, large = sorted((m0 * scale_a, m0 * scale_b))
    assert efficiency(grad, m0, large) <= efficiency(grad, m0, small) * (1 + 1e-12)


@given(grad_params, st.integers(1, 4096), st.floats(1.0, 1e4))
def test_adascale_gain_is_scale_times_efficiency_and_lies_in_one_to_scale(
    grad: GradParams, m0: int, scale: float
) -> None:
    gain = adascale_gain(grad, m0, m0 * scale)
    assert gain == pytest.approx(scale * efficiency(grad, m0, m0 * scale), rel=1e-9, abs=1e-9)
    assert 1.0 - 1e-9 <= gain <= scale * (1 + 1e-9)


@pytest.mark.parametrize("batch_size", [128, 256, 1000, 4096])
def test_efficiency_is_the_pgns_ratio_of_the_paper(batch_size: int) -> None:
    grad = GradParams(sqr=2.0, var=3.0)
    pgns = M0 * grad.var / grad.sqr
    assert efficiency(grad, M0, batch_size) == pytest.approx((pgns + M0) / (pgns + batch_size))


def test_without_statistics_the_prior_is_fully_efficient_and_zero_stats_give_no_gain() -> None:
    batches = np.array([128.0, 512.0, 4096.0])
    assert np.allclose(efficiency(GradParams(0.0, 1.0), M0, batches), 1.0)
    assert np.allclose(adascale_gain(GradParams(0.0, 0.0), M0, batches), 1.0)


def test_scalars_give_floats_and_arrays_give_arrays() -> None:
    assert isinstance(efficiency(NOISY, M0, 256), float)
    assert efficiency(NOISY, M0, [128, 256]).shape == (2,)
    fn = GoodputFunction(PERF, NOISY, M0)
    assert isinstance(fn.evaluate(1, 2, 64, 0), float)
    assert fn.evaluate(1, np.array([[1], [2]]), np.array([32, 64, 128]), 0).shape == (2, 3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: PerfParams(0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 0.5),
        lambda: PerfParams(0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 11.0),
        lambda: PerfParams(-0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.0),
        lambda: GradParams(-1.0, 1.0),
        lambda: GradParams(1.0, math.nan),
        lambda: GoodputFunction(PERF, NOISY, 0),
    ],
)
def test_invalid_parameters_are_refused(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        make()


# --- The step-time model ---------------------------------------------------------------


def compute_time(perf: PerfParams, local_bsz: float) -> float:
    return perf.alpha_c + perf.beta_c * local_bsz


@pytest.mark.parametrize(
    ("nodes", "replicas", "sync"),
    [
        (1, 1, 0.0),  # one GPU: nothing to synchronize
        (1, 2, 0.02 + 0.002 * 1e-8),  # one node, no retrogression yet (K - 2 floored)
        (1, 4, 0.02 + 0.002 * 2),  # one node: alpha_r + beta_r (K - 2)
        (2, 2, 0.08 + 0.01 * 1e-8),  # across nodes: alpha_n
        (2, 8, 0.08 + 0.01 * 6),  # across nodes: alpha_n + beta_n (K - 2)
    ],
)
def test_gamma_one_adds_compute_and_sync(nodes: int, replicas: int, sync: float) -> None:
    fn = GoodputFunction(PerfParams(0.03, 0.002, 0.08, 0.01, 0.02, 0.002, 1.0), NOISY, M0)
    expected = compute_time(fn.perf, 64) + sync
    assert fn.step_time(nodes, replicas, 64, 0) == pytest.approx(expected, rel=1e-12)


@given(perf_params, st.integers(1, 4), st.integers(0, 60), st.integers(1, 1024))
def test_gamma_ten_is_the_max_of_compute_and_sync_within_ten_percent(
    perf: PerfParams, nodes: int, extra: int, local_bsz: int
) -> None:
    replicas = max(nodes, 2) + extra
    additive = GoodputFunction(dataclasses.replace(perf, gamma=1.0), NOISY, M0)
    overlapped = GoodputFunction(dataclasses.replace(perf, gamma=10.0), NOISY, M0)
    compute = compute_time(perf, local_bsz)
    sync = additive.step_time(nodes, replicas, local_bsz, 0) - compute
    step = overlapped.step_time(nodes, replicas, local_bsz, 0)
    assert max(compute, sync) * (1 - 1e-12) <= step <= 1.1 * max(compute, sync)


@given(perf_params, st.integers(1, 4), st.integers(0, 12), st.integers(1, 512), st.integers(1, 8))
def test_each_accumulation_step_adds_one_compute_time(
    perf: PerfParams, nodes: int, extra: int, local_bsz: int, accum_steps: int
) -> None:
    fn = GoodputFunction(perf, NOISY, M0)
    replicas = nodes + extra
    added = fn.step_time(nodes, replicas, local_bsz, accum_steps) - fn.step_time(
        nodes, replicas, local_bsz, 0
    )
    assert added == pytest.approx(accum_steps * compute_time(perf, local_bsz), rel=1e-9)


@given(perf_params, st.integers(1, 512), st.integers(0, 8))
def test_one_gpu_has_no_sync_term(perf: PerfParams, local_bsz: int, accum_steps: int) -> None:
    fn = GoodputFunction(perf, NOISY, M0)
    step = (accum_steps + 1) * compute_time(perf, local_bsz)
    assert fn.step_time(1, 1, local_bsz, accum_steps) == pytest.approx(step, rel=1e-12)
    samples = local_bsz * (accum_steps + 1)
    assert fn.throughput(1, 1, local_bsz, accum_steps) == pytest.approx(samples / step, rel=1e-12)


def test_models_are_values_usable_as_cache_keys() -> None:
    same = GoodputFunction(dataclasses.replace(PERF), GradParams(1.0, 100.0), M0)
    assert GoodputFunction(PERF, NOISY, M0) == same
    assert {GoodputFunction(PERF, NOISY, M0): 1}[same] == 1


def test_goodput_is_throughput_times_efficiency() -> None:
    fn = GoodputFunction(PERF, NOISY, M0)
    expected = fn.throughput(2, 8, 96, 1) * fn.efficiency(8 * 96 * 2)
    assert fn.evaluate(2, 8, 96, 1) == pytest.approx(expected, rel=1e-12)


# --- Choosing the batch size: GoodputFunction.optimize ----------------------------------


@settings(max_examples=300, deadline=None)
@given(
    perf_params,
    grad_params,
    st.integers(1, 256),
    st.integers(1, 4),
    st.integers(0, 60),
    st.integers(1, 32),
    st.integers(1, 64),
    st.integers(1, 64),
    st.booleans(),
)
def test_optimize_respects_the_local_bounds_and_the_max_batch(
    perf: PerfParams,
    grad: GradParams,
    m0: int,
    nodes: int,
    extra: int,
    growth: int,
    low: int,
    span: int,
    accumulation: bool,
) -> None:
    fn = GoodputFunction(perf, grad, m0)
    replicas, max_batch, bounds = nodes + extra, m0 * growth, (low, low + span)
    best, local_bsz, accum = fn.optimize(nodes, replicas, max_batch, bounds, accumulation)
    if best == 0.0:
        return  # nothing fits
    assert low <= local_bsz <= low + span
    assert replicas * local_bsz * (accum + 1) <= max_batch
    assert accumulation or accum == 0
    assert best == pytest.approx(fn.evaluate(nodes, replicas, local_bsz, accum), rel=1e-12)


@pytest.mark.parametrize("accumulation", [False, True])
def test_optimize_never_does_worse_than_the_initial_batch_on_one_gpu(accumulation: bool) -> None:
    for grad in (NOISY, QUIET, GradParams(1.0, 1.0)):
        fn = GoodputFunction(PERF, grad, M0)
        best, _, _ = fn.optimize(1, 1, 32 * M0, (16, 512), accumulation)
        assert best >= fn.evaluate(1, 1, M0, 0) * (1 - 1e-12)


def chosen_batch(fn: GoodputFunction, nodes: int, replicas: int, low: int = 1) -> int:
    _, local_bsz, accum = fn.optimize(nodes, replicas, 32 * M0, (low, 256), accumulation=True)
    return replicas * local_bsz * (accum + 1)


def test_with_large_gradient_noise_the_chosen_batch_grows_with_the_gpus() -> None:
    fn = GoodputFunction(PERF, NOISY, M0)
    batches = [chosen_batch(fn, 1 if k <= 4 else k // 4, k) for k in (1, 2, 4, 8, 16)]
    assert batches == sorted(batches)
    assert batches[-1] >= 4 * batches[0]


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_with_tiny_gradient_noise_the_chosen_batch_stays_at_the_initial_one(replicas: int) -> None:
    fn = GoodputFunction(PERF, QUIET, M0)
    assert M0 <= chosen_batch(fn, 1, replicas) <= 1.05 * M0


def test_one_gpu_above_the_initial_batch_accumulates_at_least_once() -> None:
    fn = GoodputFunction(PERF, NOISY, M0)  # the best batch is far above M0 and fits one GPU
    _, local_bsz, accum = fn.optimize(1, 1, 32 * M0, (16, 4096), accumulation=True)
    assert local_bsz * (accum + 1) > M0
    assert accum >= 1
    assert fn.optimize(1, 1, 32 * M0, (16, 4096), accumulation=False)[2] == 0


def test_a_huge_per_gpu_limit_never_means_negative_accumulation() -> None:
    # 8 GPUs share a small batch: each GPU's part is a tiny fraction of the
    # limit, which used to round to -1 accumulation steps (a division by zero).
    fn = GoodputFunction(PERF, NOISY, 64)
    goodput, local_bsz, accum = fn.optimize(1, 8, 1024, (1, 1 << 30), accumulation=True)
    assert goodput > 0 and accum == 0 and local_bsz >= 8


def test_without_a_max_batch_size_the_batch_is_the_initial_one() -> None:
    fn = GoodputFunction(PERF, NOISY, M0)
    for replicas in (1, 2, 3, 4, 5):
        _, local_bsz, accum = fn.optimize(1, replicas)
        assert M0 - replicas < replicas * local_bsz * (accum + 1) <= M0


@pytest.mark.parametrize(
    ("replicas", "max_batch", "bounds", "accumulation"),
    [
        (8, M0, (32, 64), False),  # 8 GPUs x 32 samples already exceed the max batch
        (1, M0, (16, 64), False),  # M0 does not fit one GPU and cannot be split
        (1, 3 * M0, (200, 256), True),  # one GPU must accumulate, which halves m below 200
    ],
)
def test_optimize_reports_zero_goodput_when_nothing_fits(
    replicas: int, max_batch: int, bounds: tuple[int, int], accumulation: bool
) -> None:
    fn = GoodputFunction(PERF, NOISY, M0)
    assert fn.optimize(1, replicas, max_batch, bounds, accumulation)[0] == 0.0


def test_optimize_broadcasts_like_scalar_calls() -> None:
    fn = GoodputFunction(PERF, NOISY, M0)
    nodes, replicas = np.array([[1], [2]]), np.array([2, 4, 8])
    best, local_bsz, accum = fn.optimize(nodes, replicas, 32 * M0, (16, 256), True)
    assert best.shape == local_bsz.shape == accum.shape == (2, 3)
    for i, n in enumerate((1, 2)):
        for j, k in enumerate((2, 4, 8)):
            single = fn.optimize(n, k, 32 * M0, (16, 256), True)
            assert (best[i, j], local_bsz[i, j], accum[i, j]) == single


@settings(max_examples=200, deadline=None)
@given(
    perf_params,
    grad_params,
    st.integers(1, 512),
    st.integers(1, 64),
    st.integers(1, 1024),
    st.integers(0, 1024),
    st.booleans(),
)
def test_one_gpu_is_answered_exactly_as_the_broadcast_path_would(
    perf: PerfParams,
    grad: GradParams,
    m0: int,
    growth: int,
    low: int,
    span: int,
    accumulation: bool,
) -> None:
    # The tuner's question (scalars, one GPU) takes a path of its own; the answer is the same.
    fn = GoodputFunction(perf, grad, m0)
    args = (m0 * growth, (low, low + span), accumulation)
    best, local_bsz, accum = fn.optimize(np.array([1]), np.array([1]), *args)
    assert fn.optimize(1, 1, *args) == (float(best[0]), int(local_bsz[0]), int(accum[0]))


@settings(max_examples=200, deadline=None)
@given(
    perf_params,
    grad_params,
    st.integers(1, 512),
    st.integers(1, 8),
    st.integers(0, 24),
    st.integers(1, 1024),
    st.integers(0, 8),
)
def test_one_configuration_is_evaluated_as_arrays_are_to_rounding(
    perf: PerfParams, grad: GradParams, m0: int, nodes: int, extra: int, local: int, accum: int
) -> None:
    fn = GoodputFunction(perf, grad, m0)
    replicas = nodes + extra
    many = fn.evaluate([nodes], [replicas], [local], [accum])
    assert fn.evaluate(nodes, replicas, local, accum) == pytest.approx(float(many[0]), rel=1e-12)


@pytest.mark.parametrize(
    ("nodes", "replicas", "max_batch"), [(2, 1, M0), (0, 1, M0), (1, 1, M0 - 1)]
)
def test_optimize_refuses_impossible_requests(nodes: int, replicas: int, max_batch: int) -> None:
    with pytest.raises(ValueError):
        GoodputFunction(PERF, NOISY, M0).optimize(nodes, replicas, max_batch)


# --- Fitting the step-time model to measurements ----------------------------------------

CONFIGS = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4), (2, 8), (3, 12), (4, 16)]
GRID = np.array([(n, k, m) for n, k in CONFIGS for m in (16, 32, 64, 128, 256)]).T  # 45 points
TRUE_PARAMS = [
    PERF,
    PerfParams(0.2, 0.001, 0.5, 0.05, 0.1, 0.01, 1.0),  # sync-heavy, no overlap
    PerfParams(0.01, 0.004, 0.05, 0.002, 0.01, 0.0005, 6.0),  # overlapped sync
]


Measurements = tuple[IntArray, IntArray, IntArray, FloatArray, FloatArray]


def measure(perf: PerfParams, grid: IntArray, seed: int, noise: float = 0.05) -> Measurements:
    """Synthetic measurements: (nodes, replicas, local_bsz, accum time, optim time)."""
    rng = np.random.default_rng(seed)
    nodes, replicas, local_bsz = grid
    fn = GoodputFunction(perf, NOISY, M0)
    accum = (perf.alpha_c + perf.beta_c * local_bsz) * rng.lognormal(0.0, noise, local_bsz.size)
    optim = fn.step_time(nodes, replicas, local_bsz, 0) * rng.lognormal(0.0, noise, nodes.size)
    return nodes, replicas, local_bsz, accum, optim


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("true", TRUE_PARAMS)
def test_fit_predicts_step_times_within_ten_percent(true: PerfParams, seed: int) -> None:
    fitted = GoodputFunction(fit_perf_params(*measure(true, GRID, seed)), NOISY, M0)
    actual = GoodputFunction(true, NOISY, M0)
    nodes, replicas, local_bsz = GRID
    for accum in (0, 2):
        predicted = fitted.step_time(nodes, replicas, local_bsz, accum)
        error = np.abs(predicted / actual.step_time(nodes, replicas, local_bsz, accum) - 1)
        assert error.mean() < 0.10


def test_fitted_parameters_stay_in_their_bounds() -> None:
    fitted = fit_perf_params(*measure(TRUE_PARAMS[1], GRID, seed=0, noise=0.3))
    assert all(v >= 1e-8 for v in dataclasses.astuple(fitted)[:6])
    assert 1.0 <= fitted.gamma <= 10.0


def test_a_job_seen_on_one_gpu_is_predicted_to_scale_linearly() -> None:
    one_gpu = np.array([(1, 1, m) for m in (32, 64, 128)]).T
    fitted = GoodputFunction(fit_perf_params(*measure(PERF, one_gpu, seed=1)), NOISY, M0)
    for nodes in (1, 2):
        ratio = fitted.throughput(nodes, 2, 64, 0) / fitted.throughput(1, 1, 64, 0)
        assert ratio == pytest.approx(2.0, rel=1e-6)


def test_a_job_seen_on_two_gpus_of_one_node_has_no_retrogression_and_dearer_nodes() -> None:
    two_gpus = np.array([(1, k, m) for k in (1, 2) for m in (32, 64, 128)]).T
    fitted = fit_perf_params(*measure(PERF, two_gpus, seed=2))
    assert fitted.beta_r == 1e-8
    assert fitted.alpha_r > 1e-3  # learned from the 2-GPU measurements
    assert fitted.alpha_n >= 1.1 * fitted.alpha_r
    assert fitted.beta_n >= 1.1 * fitted.beta_r


def test_steps_on_several_gpus_timed_only_whole_still_teach_the_sync_cost() -> None:
    # A DDP job's runner cannot time T_grad apart on two GPUs: NaN leaves it out.
    two_gpus = np.array([(1, k, m) for k in (1, 2) for m in (32, 64, 128)]).T
    nodes, replicas, local_bsz, accum, optim = measure(PERF, two_gpus, seed=2)
    accum = np.where(replicas > 1, np.nan, accum)
    fitted = GoodputFunction(fit_perf_params(nodes, replicas, local_bsz, accum, optim), NOISY, M0)
    actual = GoodputFunction(PERF, NOISY, M0)
    for m in (32, 64, 128):
        assert fitted.step_time(1, 2, m, 0) == pytest.approx(actual.step_time(1, 2, m, 0), rel=0.1)
    assert fitted.perf.alpha_r > 1e-3


def test_retrogression_is_learned_only_where_more_than_two_gpus_were_seen() -> None:
    grid = np.array([(n, k, m) for n, k in [(1, 1), (1, 2), (2, 4), (2, 8)] for m in (32, 64)]).T
    fitted = fit_perf_params(*measure(PERF, grid, seed=4))
    assert fitted.beta_r == 1e-8  # one node never held more than 2 GPUs
    assert fitted.beta_n > 1e-3  # learned from 4 and 8 GPUs on two nodes (truth: 0.01)


def test_with_one_local_batch_size_compute_is_split_evenly() -> None:
    accum = [0.10, 0.12, 0.11]
    fitted = fit_perf_params([1, 1, 1], [1, 2, 4], [64, 64, 64], accum, [0.1, 0.15, 0.2])
    assert fitted.alpha_c == pytest.approx(np.mean(accum) / 2)
    assert fitted.alpha_c + 64 * fitted.beta_c == pytest.approx(np.mean(accum), rel=0.1)


def test_the_fit_objective_has_an_exact_gradient() -> None:
    nodes, replicas, local_bsz, accum, optim = measure(PERF, GRID, seed=3)
    samples = goodput._Samples(
        local_bsz.astype(np.float64),
        np.maximum(replicas - 2, 1e-8),
        (nodes > 1).astype(np.float64),
        ((nodes == 1) & (replicas > 1)).astype(np.float64),
        np.log(accum),
        np.log(optim),
    )
    x = np.array([0.05, 0.003, 0.1, 0.02, 0.03, 0.004, 2.5])
    _, analytic = goodput._objective(x, samples)
    step = 1e-7
    numeric = [
        (goodput._objective(x + h, samples)[0] - goodput._objective(x - h, samples)[0]) / (2 * step)
        for h in np.eye(7) * step
    ]
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "measurements",
    [
        ([1, 1], [1, 2], [32], [0.1, 0.1], [0.1, 0.2]),  # lengths differ
        ([], [], [], [], []),
        ([1], [1], [32], [0.0], [0.1]),  # a step cannot take no time
        ([1], [1], [32], [0.1], [math.nan]),  # only T_grad may be unmeasured
        ([2], [1], [32], [0.1], [0.1]),  # more nodes than replicas
    ],
)
def test_fit_refuses_malformed_measurements(measurements: tuple[list[float], ...]) -> None:
    with pytest.raises(ValueError):
        fit_perf_params(*measurements)


def one_replica_error(perf: PerfParams, local_bsz: FloatArray, seconds: FloatArray) -> float:
    """The fit objective on one replica: the RMSE of the log step times."""
    predicted = np.log(perf.alpha_c + perf.beta_c * local_bsz)
    return float(np.sqrt(np.mean((predicted - np.log(seconds)) ** 2)))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 600), min_size=1, max_size=8, unique=True),
    st.floats(-5.0, -1.0),
    st.floats(-7.0, -3.0),
    st.integers(0, 2**31),
)
def test_the_one_replica_fit_finds_the_solvers_optimum(
    sizes: list[int], log_alpha: float, log_beta: float, seed: int
) -> None:
    m = np.array(sizes, dtype=np.float64)
    noise = np.random.default_rng(seed).lognormal(0.0, 0.3, m.size)
    seconds = (10**log_alpha + 10**log_beta * m) * noise
    fast = fit_one_replica(m, seconds)
    solver = fit_perf_params([1] * m.size, [1] * m.size, m, seconds, seconds)
    assert one_replica_error(fast, m, seconds) <= one_replica_error(solver, m, seconds) + 1e-7
    assert min(fast.alpha_c, fast.beta_c) >= 1e-8
    # What only several replicas or nodes could teach stays where the solver leaves it.
    assert dataclasses.astuple(fast)[2:6] == dataclasses.astuple(solver)[2:6]


def test_the_one_replica_fit_splits_one_size_evenly_as_the_solver_does() -> None:
    fast = fit_one_replica([64, 64], [0.10, 0.12])
    solver = fit_perf_params([1, 1], [1, 1], [64, 64], [0.10, 0.12], [0.10, 0.12])
    assert fast.alpha_c == pytest.approx(solver.alpha_c)
    assert fast.alpha_c + 64 * fast.beta_c == pytest.approx(math.sqrt(0.10 * 0.12))


@pytest.mark.parametrize(
    ("local_bsz", "seconds"),
    [([], []), ([32, 64], [0.1]), ([0], [0.1]), ([32], [0.0]), ([32], [math.inf])],
    ids=["empty", "lengths-differ", "no-samples", "no-time", "infinite"],
)
def test_the_one_replica_fit_refuses_malformed_measurements(
    local_bsz: list[float], seconds: list[float]
) -> None:
    with pytest.raises(ValueError):
        fit_one_replica(local_bsz, seconds)


# --- Speedups for the scheduler ---------------------------------------------------------


@pytest.mark.parametrize("grad", [NOISY, QUIET])
@pytest.mark.parametrize("fixed_batch_size", [None, 256])
def test_speedup_is_one_on_one_gpu_and_zero_on_none(
    grad: GradParams, fixed_batch_size: int | None
) -> None:
    fn = GoodputFunction(PERF, grad, M0)
    speedup = SpeedupFunction(fn, 32 * M0, (16, 256), True, fixed_batch_size)
    assert speedup(1, 1) == pytest.approx(1.0)
    assert speedup(0, 0) == 0.0


def test_speedup_is_the_ratio_of_best_goodputs() -> None:
    fn = GoodputFunction(PERF, NOISY, M0)
    speedup = SpeedupFunction(fn, 32 * M0, (16, 256), accumulation=True)
    best = fn.optimize(2, 8, 32 * M0, (16, 256), True)[0]
    base = fn.optimize(1, 1, 32 * M0, (16, 256), True)[0]
    assert speedup(2, 8) == pytest.approx(best / base, rel=1e-12)


@pytest.mark.parametrize("grad", [NOISY, QUIET, GradParams(1.0, 1.0)])
@pytest.mark.parametrize("fixed_batch_size", [None, 512])
def test_speedup_never_drops_with_more_gpus_when_sync_is_free(
    grad: GradParams, fixed_batch_size: int | None
) -> None:
    fn = GoodputFunction(SCALABLE, grad, M0)
    speedup = SpeedupFunction(fn, 32 * M0, (8, 256), True, fixed_batch_size)
    curve = speedup(np.ones(16, dtype=int), np.arange(1, 17))
    assert np.all(curve[1:] >= curve[:-1] * (1 - 1e-5))  # up to rounding of the per-GPU batch


def test_a_fixed_batch_ignores_efficiency_and_follows_the_step_rate() -> None:
    speedups = [
        SpeedupFunction(GoodputFunction(PERF, grad, M0), fixed_batch_size=512)
        for grad in (NOISY, QUIET)
    ]
    nodes, replicas = np.array([1, 1, 1, 2, 4]), np.array([1, 2, 4, 8, 16])
    assert np.allclose(speedups[0](nodes, replicas), speedups[1](nodes, replicas))
    fn = GoodputFunction(PERF, QUIET, M0)
    expected = fn.step_time(1, 1, 512, 0) / fn.step_time(nodes, replicas, 512 // replicas, 0)
    assert np.allclose(speedups[0](nodes, replicas), expected)


def test_a_fixed_batch_accumulates_only_to_fit_and_otherwise_cannot_run() -> None:
    fn = GoodputFunction(PERF, NOISY, M0)
    split = SpeedupFunction(fn, None, (1, 128), accumulation=True, fixed_batch_size=512)
    whole = SpeedupFunction(fn, None, (1, 128), accumulation=False, fixed_batch_size=512)
    assert whole(1, 2) == 0.0  # 256 per GPU does not fit 128
    assert whole(1, 4) > 0.0
    expected = fn.step_time(1, 1, 128, 3) / fn.step_time(1, 2, 128, 1)
    assert split(1, 2) == pytest.approx(expected)
    assert SpeedupFunction(fn, fixed_batch_size=8)(2, 16) == 0.0  # more GPUs than samples


def test_speedups_are_memoized_and_broadcast() -> None:
    speedup = SpeedupFunction(GoodputFunction(PERF, NOISY, M0), 32 * M0, (16, 256), True)
    nodes, replicas = np.array([[1], [2]]), np.array([2, 4, 80])
    first = speedup(nodes, replicas)
    assert first.shape == (2, 3)
    assert np.array_equal(speedup(nodes, replicas), first)
    assert speedup(2, 80) == first[1, 2]  # beyond the memo: computed again, same value
    assert isinstance(speedup(1, 4), float)


@pytest.mark.parametrize(("nodes", "replicas"), [(2, 1), (0, 1), (1, 0), (-1, -1)])
def test_speedup_refuses_impossible_placements(nodes: int, replicas: int) -> None:
    speedup = SpeedupFunction(GoodputFunction(PERF, NOISY, M0))
    with pytest.raises(ValueError):
        speedup(nodes, replicas)


def test_importing_the_model_does_not_import_scipy() -> None:
    probe = "import gpuq.goodput, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    modules = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert modules.isdisjoint({"scipy", "torch", "pandas"})


def test_optimize_many_gives_each_models_own_optimize_exactly() -> None:
    from gpuq.goodput import optimize_many

    rng = np.random.default_rng(7)
    models, max_batches, bounds = [], [], []
    for _ in range(40):
        a_c, b_c, a_n, b_n, a_r, b_r = (float(v) for v in rng.uniform(1e-3, 0.2, 6))
        perf = PerfParams(a_c, b_c, a_n, b_n, a_r, b_r, float(rng.uniform(1, 3)))
        grad = GradParams(float(rng.uniform(0, 5)), float(rng.uniform(0, 50)))
        m0 = int(rng.choice([32, 64, 128]))
        models.append(GoodputFunction(perf, grad, m0))
        max_batches.append(None if rng.random() < 0.2 else int(m0 * rng.choice([1, 8, 64])))
        bounds.append(None if rng.random() < 0.2 else (int(rng.choice([1, 4])), 64))
    nodes, replicas = np.array([1, 1, 1, 2, 3, 1]), np.array([1, 2, 8, 8, 12, 3])
    for accumulation in (False, True):
        many = optimize_many(models, nodes, replicas, max_batches, bounds, accumulation)
        one = [
            m.optimize(nodes, replicas, b, lb, accumulation=accumulation)[0]
            for m, b, lb in zip(models, max_batches, bounds, strict=True)
        ]
        assert np.array_equal(many, np.array(one))
    assert optimize_many([], nodes, replicas, [], []).shape == (0, 6)
    with pytest.raises(ValueError, match="1 <= nodes <= replicas"):
        optimize_many(models[:1], [2], [1], [None], [None])
