"""Binding a policy's decision to GPUs (see the docstring of gpuq/daemon/scheduler/binding.py)."""

from __future__ import annotations

from gpuq.daemon.scheduler.binding import RELEASE_WAIT, Placement, placements
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView

G = 1024**3
TOLERANCE = 512 * 1024**2


def state(*jobs: JobView, foreign: dict[str, int] | None = None) -> ClusterState:
    """Two nodes: a0, a1 on node a and b0, b1 on node b."""
    gpus = tuple(
        GpuView(uuid, uuid[0], 40 * G, (foreign or {}).get(uuid, 0))
        for uuid in ("a0", "a1", "b0", "b1")
    )
    return ClusterState(
        nodes=(NodeView("a", 2), NodeView("b", 2)),
        jobs=tuple(sorted(jobs, key=lambda job: job.id)),
        gpus=gpus,
        foreign_tolerance=TOLERANCE,
    )


def pending(job_id: int, gpus: int = 1, mem: int | None = None) -> JobView:
    return JobView(job_id, 0.0, gpus_requested=gpus, gpu_mem=mem)


def running(job_id: int, *uuids: str) -> JobView:
    return JobView(job_id, 0.0, gpus_requested=len(uuids), gpu_uuids=uuids)


def test_the_policys_own_gpus_are_used_with_the_jobs_memory_share() -> None:
    cluster = state(pending(1, mem=6 * G))
    decision = Decision(allocations={1: (0, 1)}, bindings={1: ("b1",)})
    assert placements(cluster, decision) == ([Placement(1, ("b1",), 6 * G)], {})


def test_an_allocation_gets_free_gpus_of_its_nodes_in_gpu_order() -> None:
    cluster = state(running(9, "a0"), pending(1, 2), pending(2, 1), foreign={"b0": G})
    decision = Decision(allocations={9: (1, 0), 1: (1, 1), 2: (0, 0)})
    starts, waiting = placements(cluster, decision)
    # a0 is held by job 9, b0 holds another user's memory above the tolerance.
    assert starts == [Placement(1, ("a1", "b1"))]
    assert waiting == {2: "waiting for the policy to start it"}


def test_gpus_another_job_was_bound_to_are_not_handed_out_twice() -> None:
    cluster = state(pending(1), pending(2))
    decision = Decision(allocations={1: (1, 0), 2: (1, 0)}, bindings={2: ("a0",)})
    starts, waiting = placements(cluster, decision)
    assert starts == [Placement(1, ("a1",)), Placement(2, ("a0",))]
    assert waiting == {}


def test_an_allocation_beyond_the_free_gpus_waits_for_running_jobs_to_release_them() -> None:
    cluster = state(running(9, "a0", "a1"), pending(1, 2))
    starts, waiting = placements(cluster, Decision(allocations={9: (2, 0), 1: (2, 0)}))
    assert starts == []
    assert waiting == {1: "waiting for GPUs the policy expects running jobs to release"}


def test_a_job_left_out_waits_with_the_policys_reason() -> None:
    cluster = state(pending(1, 4), pending(2))
    decision = Decision(allocations={2: (1, 0)}, notes={1: "waiting for 4 free GPUs (3 free)"})
    starts, waiting = placements(cluster, decision)
    assert [p.job_id for p in starts] == [2]
    assert waiting == {1: "waiting for 4 free GPUs (3 free)"}


def test_running_jobs_are_never_started_again_and_starts_follow_the_policys_order() -> None:
    cluster = state(running(9, "a0"), pending(1), pending(2))
    decision = Decision(allocations={2: (0, 1), 9: (1, 0), 1: (0, 1)})
    starts, _ = placements(cluster, decision)
    assert [p.job_id for p in starts] == [2, 1]


def test_a_job_bound_to_gpus_a_running_job_still_holds_waits_for_them() -> None:
    # Job 9 is being preempted or shrunk off a1; the policy already gave a1 away.
    cluster = state(running(9, "a0", "a1"), pending(1), pending(2, mem=6 * G))
    decision = Decision(allocations={1: (1, 0), 2: (1, 0)}, bindings={1: ("a1",), 2: ("a0",)})
    starts, waiting = placements(cluster, decision)
    assert starts == []
    assert waiting == {1: RELEASE_WAIT, 2: RELEASE_WAIT}


def test_a_bound_share_waits_until_it_fits_beside_the_shares_there() -> None:
    shares = JobView(9, 0.0, gpu_mem=30 * G, gpu_uuids=("a0",))
    cluster = state(shares, pending(1, mem=10 * G), pending(2, mem=6 * G))
    decision = Decision(allocations={1: (1, 0), 2: (1, 0)}, bindings={1: ("a0",), 2: ("a0",)})
    starts, waiting = placements(cluster, decision)
    assert starts == [Placement(2, ("a0",), 6 * G)]
    assert waiting == {1: RELEASE_WAIT}


def test_a_start_carries_the_policys_note_for_the_event_log() -> None:
    cluster = state(pending(1))
    decision = Decision(allocations={1: (1, 0)}, notes={1: "next in the queue at priority 0"})
    [start], _ = placements(cluster, decision)
    assert start.reason == "next in the queue at priority 0"
