"""The `srtf` and `srsf` baselines rule by rule, and `fifo` as the simulator runs it.

See the docstring of gpuq/policies/baselines.py for the rules tested here;
`fifo` is the daemon's policy (gpuq/policies/fifo.py, tested with GPUs one
by one in test_policy_fifo.py), here on GPU counts per node as the
simulator gives them.
"""

from __future__ import annotations

import math

import pytest

from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.baselines import (
    FreeGpus,
    SrsfPolicy,
    SrtfPolicy,
    fixed_batch_step_time,
)
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import ClusterState, Decision, JobView, NodeView, capacity_violations

PERF = PerfParams(
    alpha_c=0.1, beta_c=0.01, alpha_n=0.5, beta_n=0.05, alpha_r=0.05, beta_r=0.01, gamma=1.0
)
MODEL = GoodputFunction(PERF, GradParams(sqr=1.0, var=1.0), init_batch_size=64)


def cluster(*gpus: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"n{i}", count) for i, count in enumerate(gpus))


def state(nodes: tuple[NodeView, ...], *jobs: JobView) -> ClusterState:
    return ClusterState(nodes=nodes, jobs=tuple(sorted(jobs, key=lambda job: job.id)))


def job(
    job_id: int,
    gpus: int = 1,
    *,
    submit: float = 0.0,
    priority: int = 0,
    allocation: tuple[int, ...] = (),
    remaining: float | None = None,
    model: GoodputFunction | None = None,
    batch: int = 0,
) -> JobView:
    return JobView(
        id=job_id,
        submit_time=submit,
        gpus_requested=gpus,
        priority=priority,
        allocation=allocation,
        remaining_iterations=remaining,
        goodput=model,
        batch_size=batch,
        init_batch_size=batch,
    )


def running_ids(decision: Decision) -> set[int]:
    return {job_id for job_id, alloc in decision.allocations.items() if sum(alloc) > 0}


# -- placement -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("free", "count", "expected"),
    [
        ([2, 4, 3], 2, (0, 2, 0)),  # the most-free node, even though node 0 fits exactly
        ([2, 4, 3], 5, (0, 4, 1)),  # fill the most-free node, then the next most-free
        ([2, 4, 3], 9, (2, 4, 3)),
        ([2, 2], 1, (1, 0)),  # ties: the earlier node
        ([4, 4, 4, 4], 6, (4, 2, 0, 0)),  # as few nodes as possible
    ],
)
def test_place_takes_the_most_free_node_first(
    free: list[int], count: int, expected: tuple[int, ...]
) -> None:
    gpus = FreeGpus(state(cluster(*free)))
    assert gpus.place(count) == expected
    assert gpus.free == [f - e for f, e in zip(free, expected, strict=True)]


@pytest.mark.parametrize(
    ("allocation", "ok"),
    [((1, 2), True), ((3, 0), False), ((1,), False), ((0, 0), False), ((-1, 2), False)],
)
def test_take_books_only_well_formed_allocations_that_fit(
    allocation: tuple[int, ...], ok: bool
) -> None:
    gpus = FreeGpus(state(cluster(2, 2)))
    assert gpus.take(allocation) is ok
    assert gpus.total == (4 - sum(allocation) if ok else 4)


def test_place_refuses_more_than_is_free() -> None:
    gpus = FreeGpus(state(cluster(2, 2)))
    assert gpus.place(5) is None
    assert gpus.total == 4


# -- step time at a fixed batch ------------------------------------------------------


def test_step_time_without_a_model_scales_linearly() -> None:
    plain = job(1)
    assert [fixed_batch_step_time(plain, n, 4, 2.0) for n in (1, 2, 4)] == [2.0, 1.0, 0.5]


def test_step_time_splits_the_fixed_batch_and_accumulates_above_the_local_limit() -> None:
    bounded = JobView(id=1, submit_time=0, batch_size=256, goodput=MODEL, local_bsz_bounds=(8, 64))
    # 256 on 2 GPUs is 128 per GPU: two micro-batches of 64 (one accumulation step).
    assert fixed_batch_step_time(bounded, 2, 4) == pytest.approx(MODEL.step_time(1, 2, 64, 1))
    # 256 on 8 GPUs packed 4 per node: two nodes, 32 per GPU, no accumulation.
    assert fixed_batch_step_time(bounded, 8, 4) == pytest.approx(MODEL.step_time(2, 8, 32, 0))


# -- fifo ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        # Submit order: the two oldest fit, the third waits.
        ([job(1, 2, submit=0), job(2, 2, submit=1), job(3, 2, submit=2)], {1, 2}),
        # Priority first, then submit time.
        ([job(1, 2, submit=0), job(2, 2, submit=1), job(3, 2, submit=2, priority=5)], {3, 1}),
        # Backfill: the 4-GPU head does not fit behind the 2-GPU job; the 1-GPU jobs do.
        ([job(1, 2), job(2, 4, submit=1), job(3, 1, submit=2), job(4, 1, submit=3)], {1, 3, 4}),
        # A request larger than the cluster never runs and blocks nobody.
        ([job(1, 9), job(2, 4, submit=1)], {2}),
    ],
)
def test_fifo_starts_jobs_in_queue_order_where_they_fit(
    jobs: list[JobView], expected: set[int]
) -> None:
    view = state(cluster(2, 2), *jobs)
    decision = FifoBackfill().decide(view, 0.0)
    assert running_ids(decision) == expected
    assert capacity_violations(view, decision) == []


def test_fifo_is_gang_exactly_the_requested_count() -> None:
    view = state(cluster(4, 4), job(1, 3), job(2, 5, submit=1))
    decision = FifoBackfill().decide(view, 0.0)
    assert {k: sum(v) for k, v in decision.allocations.items()} == {1: 3, 2: 5}


def test_fifo_never_preempts_a_running_job() -> None:
    view = state(
        cluster(2, 2),
        job(1, 4, submit=10, allocation=(2, 2)),
        job(2, 1, submit=0, priority=9),
    )
    decision = FifoBackfill().decide(view, 0.0)
    assert decision.allocations == {1: (2, 2)}
    assert decision.notes[2] == "waiting for 1 free GPU (0 free)"


def test_fifo_keeps_the_gpus_of_running_jobs() -> None:
    view = state(cluster(4, 4), job(1, 2, allocation=(2, 0)), job(2, 4, submit=1))
    decision = FifoBackfill().decide(view, 0.0)
    assert decision.allocations[1] == (2, 0)
    assert decision.allocations[2] == (0, 4)


def test_fifo_places_a_job_on_the_fullest_node_that_fits_it() -> None:
    # Node 0 has 2 free GPUs and node 1 has 4: a 2-GPU job fills node 0 and
    # leaves node 1 whole for a 4-GPU job.
    view = state(cluster(4, 4), job(1, 2, allocation=(2, 0)), job(2, 2, submit=1))
    decision = FifoBackfill().decide(view, 0.0)
    assert decision.allocations[2] == (2, 0)


# -- srtf / srsf -------------------------------------------------------------------------


def test_srtf_runs_the_shortest_remaining_time_first_and_preempts_longer_jobs() -> None:
    long_running = job(1, 4, remaining=1000, allocation=(4,))
    short_arrival = job(2, 4, submit=5, remaining=10)
    decision = SrtfPolicy().decide(state(cluster(4), long_running, short_arrival), 0.0)
    assert running_ids(decision) == {2}
    assert decision.notes[1] == "preempted for job 2, ahead of it in rank order"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # Remaining time: job 1 takes 100 steps x 1 s / 4 GPUs = 25 s, job 2 takes 40 s;
        # job 1 ranks first and takes all 4 GPUs.
        (SrtfPolicy(), {1}),
        # Remaining service: job 1 is 25 s x 4 GPUs = 100, job 2 is 40 s x 1 GPU = 40;
        # job 2 ranks first, and job 1's gang no longer fits in the 3 GPUs left.
        (SrsfPolicy(), {2}),
    ],
    ids=["srtf", "srsf"],
)
def test_srtf_ranks_by_time_and_srsf_by_time_times_gpus(
    policy: SrtfPolicy, expected: set[int]
) -> None:
    jobs = [job(1, 4, remaining=100), job(2, 1, remaining=40, submit=1)]
    decision = policy.decide(state(cluster(4), *jobs), 0.0)
    assert running_ids(decision) == expected


def test_srtf_uses_the_throughput_model_at_the_requested_count() -> None:
    # Same iterations; the model makes job 1's steps slower (bigger batch), so it ranks second.
    slow = job(1, 1, remaining=100, model=MODEL, batch=512)
    fast = job(2, 1, remaining=100, model=MODEL, batch=64, submit=1)
    decision = SrtfPolicy().decide(state(cluster(1), slow, fast), 0.0)
    assert running_ids(decision) == {2}


def test_srtf_skips_what_does_not_fit_and_runs_later_jobs() -> None:
    jobs = [job(1, 2, remaining=1), job(2, 4, remaining=2), job(3, 2, remaining=3)]
    decision = SrtfPolicy().decide(state(cluster(4), *jobs), 0.0)
    assert running_ids(decision) == {1, 3}


def test_srtf_ranks_jobs_of_unknown_length_last_in_submit_order() -> None:
    jobs = [job(1, 2, submit=0), job(2, 2, submit=1), job(3, 2, remaining=1e9, submit=2)]
    decision = SrtfPolicy().decide(state(cluster(4), *jobs), 0.0)
    assert running_ids(decision) == {3, 1}
    assert SrtfPolicy().remaining(jobs[0], 4) == math.inf


def test_srtf_keeps_the_placement_of_a_job_that_keeps_running() -> None:
    jobs = [job(1, 1, remaining=5, allocation=(0, 1)), job(2, 2, remaining=50, submit=1)]
    decision = SrtfPolicy().decide(state(cluster(2, 2), *jobs), 0.0)
    assert decision.allocations[1] == (0, 1)
    assert decision.allocations[2] == (2, 0)
