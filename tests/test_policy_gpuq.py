"""The `gpuq` policy: Pollux's decisions, minus the moves that do not pay."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.policies.elastic import ClusterState, JobView, capacity_violations
from gpuq.policies.gpuq_default import GpuqPolicy
from gpuq.policies.pollux import PolluxPolicy
from gpuq.policies.registry import get_elastic_policy
from tests.test_policy_pollux import LINEAR, LOCAL, NOW, POOR, cluster, job


def busy_state() -> ClusterState:
    """Running jobs of mixed scalability plus a newcomer: the search wants moves."""
    jobs = (
        job(1, LINEAR, allocation=(4, 0), max_profiled_gpus=2),
        job(2, POOR, allocation=(0, 2), submit_time=NOW - 120.0),
        job(3, LOCAL, allocation=(0, 1), submit_time=NOW - 60.0),
        job(4, LOCAL, submit_time=NOW - 10.0),
    )
    return ClusterState(cluster(4, 4), jobs)


def test_the_registry_knows_the_default_policy() -> None:
    assert isinstance(get_elastic_policy("gpuq"), GpuqPolicy)


def test_with_no_tolerance_it_decides_exactly_like_pollux() -> None:
    state = busy_state()
    ours = GpuqPolicy(seed=3, tolerance=0.0).decide(state, NOW)
    theirs = PolluxPolicy(seed=3).decide(state, NOW)
    assert dict(ours.allocations) == dict(theirs.allocations)


def test_moves_are_undone_only_within_the_tolerance_and_never_over_capacity() -> None:
    state = busy_state()
    pollux = PolluxPolicy(seed=3)
    base = pollux.decide(state, NOW)
    ours = GpuqPolicy(seed=3, tolerance=0.05).decide(state, NOW)
    assert capacity_violations(state, ours) == []
    best = pollux.fitness(state, NOW, base.allocations)
    assert PolluxPolicy(seed=3).fitness(state, NOW, ours.allocations) >= best * (1 - 0.05) - 1e-12
    current = {j.id: j.allocation for j in state.jobs if j.running}
    for job_id, allocation in ours.allocations.items():
        if allocation != base.allocations.get(job_id):
            assert allocation == current[job_id], "the only change: back to the current GPUs"


def test_a_growth_worth_less_than_the_tolerance_is_undone() -> None:
    jobs = (
        job(1, POOR, allocation=(0, 3), max_profiled_gpus=3, submit_time=NOW - 60.0),
        job(2, LINEAR, max_profiled_gpus=1, submit_time=NOW - 60.0),
        job(3, LOCAL, allocation=(3, 0), max_profiled_gpus=3, submit_time=NOW - 300.0),
    )
    state = ClusterState(cluster(4, 4), jobs)
    pollux = dict(PolluxPolicy(seed=3).decide(state, NOW).allocations)
    ours = dict(GpuqPolicy(seed=3, tolerance=0.05).decide(state, NOW).allocations)
    assert pollux[3] == (4, 0), "Pollux restarts job 3 to give it one more GPU"
    assert ours[3] == (3, 0), "gpuq keeps it running where it is"
    assert {k: v for k, v in ours.items() if k != 3} == {k: v for k, v in pollux.items() if k != 3}


def test_a_pending_job_is_never_held_back_by_the_filter() -> None:
    state = busy_state()
    base = PolluxPolicy(seed=3).decide(state, NOW)
    ours = GpuqPolicy(seed=3, tolerance=0.5).decide(state, NOW)
    assert (4 in base.allocations) == (4 in ours.allocations)


def test_decisions_are_deterministic_for_a_seed() -> None:
    state = busy_state()
    first = GpuqPolicy(seed=7).decide(state, NOW)
    second = GpuqPolicy(seed=7).decide(state, NOW)
    assert dict(first.allocations) == dict(second.allocations)


@pytest.mark.parametrize("tolerance", [-0.1, 1.0])
def test_the_tolerance_must_be_a_fraction(tolerance: float) -> None:
    with pytest.raises(ValueError, match="tolerance"):
        GpuqPolicy(tolerance=tolerance)


def test_jobs_without_models_still_get_gpus() -> None:
    fresh: JobView = replace(job(1, None), max_profiled_gpus=0)
    decision = GpuqPolicy().decide(ClusterState(cluster(4), (fresh,)), NOW)
    assert sum(decision.allocations.get(1, ())) >= 1


def test_a_current_allocation_above_the_cap_is_never_offered_back() -> None:
    over = replace(job(1, None), adaptive=False, max_gpus=1, allocation=(1, 1))
    decision = GpuqPolicy(seed=0).decide(ClusterState(cluster(1, 1), (over,)), NOW)
    assert sum(decision.allocations.get(1, ())) <= 1
