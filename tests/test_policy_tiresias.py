"""The `tiresias` policy (discretized 2D-LAS), rule by rule.

See the docstring of gpuq/policies/tiresias.py for the rules tested here.
"""

from __future__ import annotations

import pytest

from gpuq.errors import UsageError
from gpuq.policies.interface import ClusterState, JobView, NodeView, capacity_violations
from gpuq.policies.registry import get_policy
from gpuq.policies.tiresias import TiresiasPolicy

HOUR = 3600.0
THRESHOLD = 16 * HOUR  # GPU-seconds


def cluster(*gpus: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"n{i}", count) for i, count in enumerate(gpus))


def job(
    job_id: int,
    gpus: int = 1,
    *,
    submit: float = 0.0,
    service: float = 0.0,
    allocation: tuple[int, ...] = (),
) -> JobView:
    return JobView(
        id=job_id,
        submit_time=submit,
        gpus_requested=gpus,
        attained_service=service,
        allocation=allocation,
    )


def decide(nodes: tuple[NodeView, ...], *jobs: JobView) -> dict[int, tuple[int, ...]]:
    view = ClusterState(nodes=nodes, jobs=tuple(sorted(jobs, key=lambda j: j.id)))
    decision = TiresiasPolicy().decide(view, 0.0)
    assert capacity_violations(view, decision) == []
    return dict(decision.allocations)


@pytest.mark.parametrize(
    ("service", "queue"),
    [
        (0.0, 0),
        (THRESHOLD - 1, 0),
        (THRESHOLD, 1),  # demoted exactly at the threshold
        (100 * THRESHOLD, 1),  # two queues: nowhere lower than queue 1
    ],
)
def test_a_job_is_demoted_when_its_service_reaches_16_gpu_hours(service: float, queue: int) -> None:
    assert TiresiasPolicy().queue(job(1, service=service)) == queue


@pytest.mark.parametrize(
    ("thresholds", "service", "queue"),
    [((1.0,), 1 * HOUR, 1), ((1.0, 4.0), 2 * HOUR, 1), ((1.0, 4.0), 4 * HOUR, 2)],
)
def test_thresholds_are_configurable_in_gpu_hours(
    thresholds: tuple[float, ...], service: float, queue: int
) -> None:
    policy = TiresiasPolicy(thresholds_gpu_hours=thresholds)
    assert policy.queue(job(1, service=service)) == queue


def test_thresholds_must_increase_and_be_positive() -> None:
    with pytest.raises(UsageError, match="must increase"):
        TiresiasPolicy(thresholds_gpu_hours=(4.0, 1.0))
    with pytest.raises(UsageError, match="must be positive"):
        TiresiasPolicy(thresholds_gpu_hours=(0.0, 1.0))


def test_one_threshold_can_be_given_as_a_number_as_a_policy_option_gives_it() -> None:
    policy = get_policy("tiresias:thresholds_gpu_hours=0.5")
    assert policy.queue(job(1, service=0.5 * HOUR)) == 1  # type: ignore[attr-defined]
    assert policy.queue(job(1, service=0.4 * HOUR)) == 0  # type: ignore[attr-defined]


def test_a_demoted_job_is_preempted_by_a_newer_job_of_queue_0() -> None:
    veteran = job(1, 4, submit=0, service=THRESHOLD, allocation=(4,))
    newcomer = job(2, 4, submit=100)
    assert decide(cluster(4), veteran, newcomer) == {2: (4,)}


def test_a_job_just_below_the_threshold_keeps_its_gpus() -> None:
    veteran = job(1, 4, submit=0, service=THRESHOLD - 1, allocation=(4,))
    newcomer = job(2, 4, submit=100)
    assert decide(cluster(4), veteran, newcomer) == {1: (4,)}


def test_fifo_by_submission_within_a_queue() -> None:
    jobs = [job(3, 2, submit=0), job(1, 2, submit=5), job(2, 2, submit=9)]
    assert set(decide(cluster(4), *jobs)) == {3, 1}
    demoted = [job(j.id, 2, submit=j.submit_time, service=THRESHOLD) for j in jobs]
    assert set(decide(cluster(4), *demoted)) == {3, 1}


def test_gang_a_job_runs_with_all_its_gpus_or_none_and_smaller_jobs_pass_it() -> None:
    jobs = [job(1, 3), job(2, 2, submit=1), job(3, 1, submit=2)]
    allocations = decide(cluster(2, 2), *jobs)
    assert set(allocations) == {1, 3}
    assert sum(allocations[1]) == 3


def test_a_running_job_keeps_its_exact_placement() -> None:
    # The most-free rule alone would put job 1 on node 1; it stays where it is.
    jobs = [job(1, 2, allocation=(1, 1)), job(2, 1, submit=1)]
    allocations = decide(cluster(2, 2), *jobs)
    assert allocations[1] == (1, 1)
    assert allocations[2] == (1, 0)


def test_a_starting_job_goes_to_the_node_with_the_most_free_gpus() -> None:
    jobs = [job(1, 1, allocation=(1, 0, 0)), job(2, 2, submit=1)]
    assert decide(cluster(4, 4, 4), *jobs)[2] == (0, 2, 0)


def test_the_starvation_knob_is_off_a_long_wait_does_not_promote() -> None:
    # However long job 1 has waited, its service keeps it in queue 1.
    waited = job(1, 4, submit=0, service=THRESHOLD)
    fresh = job(2, 4, submit=10 * THRESHOLD)
    assert decide(cluster(4), waited, fresh) == {2: (4,)}


def test_notes_name_each_jobs_queue() -> None:
    view = ClusterState(cluster(4), (job(1, 4, service=THRESHOLD), job(2, 4)))
    notes = TiresiasPolicy().decide(view, 0.0).notes
    assert notes[2] == "queue 0"
    assert notes[1].startswith("queue 1, waiting")
