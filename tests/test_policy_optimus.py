"""The `optimus` policy (Optimus+Oracle), rule by rule.

See the docstring of gpuq/policies/optimus.py for the rules tested here.
"""

from __future__ import annotations

import itertools

import pytest

from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.interface import ClusterState, JobView, NodeView, capacity_violations
from gpuq.policies.optimus import OptimusPolicy

GRAD = GradParams(sqr=1.0, var=1.0)
# Compute-bound: adding GPUs helps.
SCALES = GoodputFunction(PerfParams(0.05, 0.01, 0.2, 0.01, 0.02, 0.001, 1.0), GRAD, 64)
# Sync-bound: two GPUs are slower than one.
STALLS = GoodputFunction(PerfParams(0.01, 0.0001, 5.0, 1.0, 5.0, 1.0, 1.0), GRAD, 64)


def cluster(*gpus: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"n{i}", count) for i, count in enumerate(gpus))


def job(
    job_id: int,
    *,
    submit: float = 0.0,
    remaining: float | None = 1000.0,
    model: GoodputFunction | None = SCALES,
    batch: int = 256,
    min_local: int = 1,
    allocation: tuple[int, ...] = (),
) -> JobView:
    return JobView(
        id=job_id,
        submit_time=submit,
        batch_size=batch,
        init_batch_size=min(batch, 64) if batch else 0,
        local_bsz_bounds=(min_local, 1 << 20),
        remaining_iterations=remaining,
        goodput=model,
        allocation=allocation,
    )


def state(nodes: tuple[NodeView, ...], *jobs: JobView) -> ClusterState:
    return ClusterState(nodes=nodes, jobs=tuple(sorted(jobs, key=lambda j: j.id)))


def counts(nodes: tuple[NodeView, ...], *jobs: JobView) -> dict[int, int]:
    view = state(nodes, *jobs)
    decision = OptimusPolicy().decide(view, 0.0)
    assert capacity_violations(view, decision) == []
    return {job_id: sum(alloc) for job_id, alloc in decision.allocations.items()}


def test_every_job_gets_one_gpu_first_in_submission_order() -> None:
    jobs = [job(1, submit=20), job(2, submit=10), job(3, submit=30), job(4, submit=0)]
    assert counts(cluster(3), *jobs) == {4: 1, 2: 1, 1: 1}


def test_the_next_gpu_goes_to_the_larger_marginal_gain() -> None:
    # Identical speed curves: the job with more remaining iterations gains more.
    small, large = job(1, remaining=100), job(2, remaining=10_000, submit=1)
    assert counts(cluster(3), small, large) == {1: 1, 2: 2}


def test_the_gain_is_the_step_time_saved_times_remaining_iterations() -> None:
    # Job 2 has more iterations left, but job 1's steps shrink far more with a 2nd GPU.
    big_batch, small_batch = job(1, remaining=100, batch=256), job(2, remaining=300, batch=32)
    gain_1 = (SCALES.step_time(1, 1, 256, 0) - SCALES.step_time(1, 2, 128, 0)) * 100
    gain_2 = (SCALES.step_time(1, 1, 32, 0) - SCALES.step_time(1, 2, 16, 0)) * 300
    assert gain_1 > gain_2
    assert counts(cluster(3), big_batch, small_batch) == {1: 2, 2: 1}


def test_a_job_never_gets_more_than_batch_size_over_the_smallest_local_batch() -> None:
    capped = job(1, batch=128, min_local=32)  # max_replicas = 4
    assert OptimusPolicy.max_replicas(capped, 16) == 4
    assert counts(cluster(4, 4), capped) == {1: 4}


def test_a_job_that_slows_down_with_more_gpus_gets_no_more() -> None:
    assert counts(cluster(4), job(1, model=STALLS)) == {1: 1}


def test_jobs_without_a_model_scale_linearly() -> None:
    plain = [job(1, model=None, remaining=300), job(2, model=None, remaining=100, submit=1)]
    # Gains r * (1/n - 1/(n+1)): 150 for job 1's second GPU beats 50 for job 2's.
    assert counts(cluster(3), *plain) == {1: 2, 2: 1}


def test_unknown_remaining_work_counts_one_iteration() -> None:
    known = job(1, model=None, remaining=10)
    unknown = job(2, model=None, remaining=None, submit=1)
    assert OptimusPolicy.remaining(unknown) == 1.0
    assert counts(cluster(3), known, unknown) == {1: 2, 2: 1}


def test_an_unchanged_count_keeps_its_gpus_and_others_pack() -> None:
    jobs = [job(1, batch=1, allocation=(0, 1)), job(2, model=None, batch=2, submit=1)]
    view = state(cluster(2, 2), *jobs)
    allocations = OptimusPolicy().decide(view, 0.0).allocations
    assert allocations[1] == (0, 1)  # max_replicas 1: unchanged, kept in place
    assert allocations[2] == (2, 0)  # placed on the most-free node


def brute_force(remaining: list[float], caps: list[int], gpus: int) -> float:
    """The least total remaining time r / n over every allocation, 1 <= n <= cap."""
    best = float("inf")
    for alloc in itertools.product(*(range(1, cap + 1) for cap in caps)):
        if sum(alloc) <= gpus:
            best = min(best, sum(r / n for r, n in zip(remaining, alloc, strict=True)))
    return best


@pytest.mark.parametrize(
    ("remaining", "caps", "gpus"),
    [
        ([100, 100], [4, 4], 6),
        ([900, 100, 10], [8, 8, 8], 8),
        ([50, 400, 400], [2, 3, 8], 7),
        ([1, 1, 1, 1], [4, 4, 4, 4], 4),
    ],
)
def test_greedy_matches_brute_force_when_gains_are_concave(
    remaining: list[float], caps: list[int], gpus: int
) -> None:
    jobs = [
        job(i, model=None, remaining=r, batch=cap, submit=i)
        for i, (r, cap) in enumerate(zip(remaining, caps, strict=True))
    ]
    got = counts(cluster(gpus), *jobs)
    total = sum(r / got[i] for i, r in enumerate(remaining))
    assert total == pytest.approx(brute_force(remaining, caps, gpus))
