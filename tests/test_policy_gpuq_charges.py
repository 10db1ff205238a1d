"""The `gpuq` policy's restart charges on Pollux's search (see its module docstring).

The lab rules (classes, admission, shares, time-slicing, reasons) are in
tests/test_policy_gpuq.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpuq.policies.baselines import fixed_batch_step_time
from gpuq.policies.gpuq.estimates import remaining_time
from gpuq.policies.gpuq.policy import GpuqPolicy, remaining_factor
from gpuq.policies.interface import ClusterState, JobView, capacity_violations
from gpuq.policies.pollux.policy import PolluxPolicy, realloc_factor
from gpuq.policies.registry import get_policy
from tests.test_policy_pollux import LINEAR, LOCAL, NOW, POOR, cluster, job

PENALTY = 30.0


def remaining_aware(seed: int = 0) -> GpuqPolicy:
    """The gpuq policy with its remaining-time move charge (off by default) turned on."""
    return GpuqPolicy(seed=seed, remaining_aware=True)


def busy_state() -> ClusterState:
    """Running jobs of mixed scalability plus a newcomer: the search wants moves."""
    jobs = (
        job(1, LINEAR, allocation=(4, 0), max_profiled_gpus=2, remaining_iterations=1e6),
        job(2, POOR, allocation=(0, 2), submit_time=NOW - 120.0, remaining_iterations=1e5),
        job(3, LOCAL, allocation=(0, 1), submit_time=NOW - 60.0, remaining_iterations=1e5),
        job(4, LOCAL, submit_time=NOW - 10.0, remaining_iterations=1e5),
    )
    return ClusterState(cluster(4, 4), jobs)


def full_cluster_and_a_newcomer() -> ClusterState:
    """A scalable job holds all 4 GPUs; job 2 arrives at the decision instant."""
    jobs = (
        job(1, LINEAR, allocation=(4,), max_profiled_gpus=4, remaining_iterations=1e6),
        job(2, LOCAL, submit_time=NOW, max_profiled_gpus=0),
    )
    return ClusterState(cluster(4), jobs)


def nearly_done_state(iterations: float) -> ClusterState:
    """One adaptive job on 1 of 4 GPUs with `iterations` left: growing it is a gain."""
    lone = job(1, LINEAR, allocation=(1,), max_profiled_gpus=4, remaining_iterations=iterations)
    return ClusterState(cluster(4), (lone,))


def factors(policy: PolluxPolicy, state: ClusterState) -> dict[int, float]:
    """REALLOC_FACTOR per job id in the policy's search problem."""
    jobs, problem = policy.problem(state, NOW)
    return {j.id: float(f) for j, f in zip(jobs, problem.realloc_factor, strict=True)}


def test_the_registry_builds_gpuq_as_the_default_policy() -> None:
    assert isinstance(get_policy("gpuq"), GpuqPolicy)


def test_with_charged_starts_and_no_remaining_rule_it_decides_exactly_like_pollux() -> None:
    state = busy_state()
    ours = GpuqPolicy(seed=3, starts="charged", remaining_aware=False).decide(state, NOW)
    theirs = PolluxPolicy(seed=3).decide(state, NOW)
    assert dict(ours.allocations) == dict(theirs.allocations)


def idle_gpus_and_a_newcomer() -> ClusterState:
    """A job holds 2 of 4 GPUs and cannot use more; job 2 arrives at the decision instant."""
    jobs = (
        job(1, LOCAL, allocation=(2,), max_profiled_gpus=2, max_gpus=2),
        job(2, LOCAL, submit_time=NOW, max_profiled_gpus=0),
    )
    return ClusterState(cluster(4), jobs)


def test_a_job_arriving_at_the_decision_instant_takes_idle_gpus_at_once() -> None:
    state = idle_gpus_and_a_newcomer()
    assert factors(PolluxPolicy(), state)[2] == 0.0, "Pollux: worth nothing yet"
    assert factors(GpuqPolicy(), state)[2] == 1.0
    decision = GpuqPolicy(seed=0).decide(state, NOW)
    assert sum(decision.allocations.get(2, ())) >= 1
    assert decision.allocations[1] == (2,), "the running job is not disturbed"
    assert capacity_violations(state, decision) == []


def test_in_a_full_cluster_a_start_keeps_the_pollux_charge_by_default() -> None:
    state = full_cluster_and_a_newcomer()
    assert factors(GpuqPolicy(), state) == factors(PolluxPolicy(), state)
    assert 2 not in GpuqPolicy(seed=0, timeslice="off").decide(state, NOW).allocations


def test_with_all_starts_free_a_newcomer_starts_at_once_in_a_full_cluster() -> None:
    state = full_cluster_and_a_newcomer()
    decision = GpuqPolicy(seed=0, starts="free").decide(state, NOW)
    assert sum(decision.allocations.get(2, ())) >= 1
    assert capacity_violations(state, decision) == []


def test_with_gpus_idle_a_waiting_job_is_charged_nothing_however_often_it_restarted() -> None:
    waiting = (
        job(1, LOCAL, submit_time=NOW),
        job(2, LOCAL, submit_time=NOW - 60.0, num_restarts=5),
    )
    state = ClusterState(cluster(4), waiting)
    assert factors(PolluxPolicy(), state) == {1: 0.0, 2: 0.0}
    assert factors(GpuqPolicy(), state) == {1: 1.0, 2: 1.0}


def test_an_unknown_start_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="starts must be one of idle, free, charged"):
        GpuqPolicy(starts="sometimes")


def test_a_nearly_finished_job_is_not_moved_for_a_gain_its_restart_would_eat() -> None:
    state = nearly_done_state(iterations=30.0)
    left = remaining_time(state.jobs[0], 1, 1)
    assert left is not None and left < PENALTY / 3, "seconds left, well under one restart"
    assert sum(PolluxPolicy(seed=0).decide(state, NOW).allocations[1]) > 1, "Pollux grows it"
    assert remaining_aware(seed=0).decide(state, NOW).allocations[1] == (1,)


def test_a_job_with_much_work_left_grows_as_under_pollux() -> None:
    state = nearly_done_state(iterations=1e7)
    ours = remaining_aware(seed=0).decide(state, NOW).allocations
    assert ours == PolluxPolicy(seed=0).decide(state, NOW).allocations
    assert sum(ours[1]) > 1


@pytest.mark.parametrize("iterations", [0.0, 30.0, 3e3, 3e5])
def test_the_move_charge_is_remaining_time_over_remaining_time_plus_the_penalty(
    iterations: float,
) -> None:
    running = nearly_done_state(iterations).jobs[0]
    left = remaining_time(running, 1, 1)
    assert left is not None
    assert remaining_factor(running, PENALTY) == pytest.approx(left / (left + PENALTY))


def test_the_move_charge_is_never_lighter_than_pollux() -> None:
    state = busy_state()
    ours, theirs = factors(remaining_aware(), state), factors(PolluxPolicy(), state)
    for view in state.jobs:
        if view.running:
            assert ours[view.id] <= theirs[view.id]
    assert ours[1] == theirs[1], "a million iterations left: the age is the smaller charge"


def test_without_a_remaining_count_or_a_model_moves_are_charged_as_in_pollux() -> None:
    unknown = replace(busy_state().jobs[0], remaining_iterations=None)
    assert remaining_factor(unknown, PENALTY) == 1.0
    assert remaining_factor(replace(unknown, goodput=None), PENALTY) == 1.0


def test_more_gpus_shorten_the_remaining_time_of_a_scalable_job() -> None:
    view = busy_state().jobs[0]
    times = [remaining_time(view, 1, gpus) for gpus in (1, 2, 4)]
    assert all(t is not None for t in times)
    assert times[0] > times[1] > times[2]  # type: ignore[operator]


def test_a_fixed_batch_job_needs_its_steps_times_the_step_time() -> None:
    fixed = replace(busy_state().jobs[1], adaptive=False, batch_size=256)
    expected = 1e5 * fixed_batch_step_time(fixed, 2, 2)
    assert remaining_time(fixed, 1, 2) == pytest.approx(expected)


def test_a_finished_or_unknown_job_has_a_trivial_estimate() -> None:
    view = busy_state().jobs[0]
    assert remaining_time(replace(view, remaining_iterations=0.0), 1, 1) == 0.0
    assert remaining_time(replace(view, remaining_iterations=None), 1, 1) is None
    assert remaining_time(replace(view, goodput=None), 1, 1) is None
    assert remaining_time(view, 1, 0) is None


def test_decisions_fit_the_cluster_and_are_deterministic_for_a_seed() -> None:
    state = busy_state()
    first = GpuqPolicy(seed=7).decide(state, NOW)
    second = GpuqPolicy(seed=7).decide(state, NOW)
    assert dict(first.allocations) == dict(second.allocations)
    assert capacity_violations(state, first) == []


def test_jobs_without_models_still_get_gpus() -> None:
    fresh: JobView = replace(job(1, None), max_profiled_gpus=0)
    decision = GpuqPolicy().decide(ClusterState(cluster(4), (fresh,)), NOW)
    assert sum(decision.allocations.get(1, ())) >= 1


def test_the_pollux_charge_it_replaces_is_the_age_based_one() -> None:
    state = nearly_done_state(iterations=1e7)
    expected = realloc_factor(NOW, 0, PENALTY)
    assert factors(PolluxPolicy(), state)[1] == pytest.approx(expected)
    assert math.isclose(factors(remaining_aware(), state)[1], expected)


def test_by_default_a_running_job_is_charged_exactly_as_in_pollux() -> None:
    state = nearly_done_state(iterations=30.0)
    assert factors(GpuqPolicy(), state) == factors(PolluxPolicy(), state)
