"""Moves on one server, rule by rule (see the docstring of gpuq/policies/consolidate.py).

Each case runs `fifo` (which plans its moves with `consolidate`) and reads
the decision as the daemon does: the actions `plan` makes of it, and what
`binding` starts.
"""

from __future__ import annotations

import pytest

from gpuq.daemon.scheduler.binding import RELEASE_WAIT, Placement, placements
from gpuq.policies.actions import Kind, plan
from gpuq.policies.consolidate import movable
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView

G = 1024**3
NOW = 1000.0
SETTLE = 60.0


def gpus(count: int, groups: str = "") -> list[GpuView]:
    """GPUs 0..count-1 of 16G; `groups` gives each GPU's link group by letter ("" unknown)."""
    return [
        GpuView(f"GPU-{i}", "n1", 16 * G, link_group=groups[i] if groups else "", index=i)
        for i in range(count)
    ]


def share(
    job_id: int,
    gpu: int,
    mem: int = 5 * G,
    *,
    start: float = 0.0,
    moved_at: float | None = None,
    preemptible: bool = True,
) -> JobView:
    """A running memory-share job on GPU `gpu`."""
    return JobView(
        job_id,
        0.0,
        gpu_mem=mem,
        gpu_uuids=(f"GPU-{gpu}",),
        allocation=(1,),
        start_time=start,
        moved_at=moved_at,
        preemptible=preemptible,
    )


def whole(job_id: int, gpu: int, *, start: float = 0.0, preemptible: bool = True) -> JobView:
    """A running single-GPU job holding GPU `gpu` whole."""
    return JobView(
        job_id,
        0.0,
        gpu_uuids=(f"GPU-{gpu}",),
        allocation=(1,),
        start_time=start,
        preemptible=preemptible,
    )


def waiting(job_id: int, count: int = 1, mem: int | None = None) -> JobView:
    return JobView(job_id, float(job_id), gpus_requested=count, gpu_mem=mem)


def state(devices: list[GpuView], *jobs: JobView) -> ClusterState:
    return ClusterState(
        nodes=(NodeView("n1", len(devices)),),
        jobs=tuple(sorted(jobs, key=lambda job: job.id)),
        gpus=tuple(devices),
        memory_margin=0.0,
    )


def decide(cluster: ClusterState, settle: float = SETTLE) -> Decision:
    return FifoBackfill(move_after=settle).decide(cluster, NOW)


def moves(cluster: ClusterState, decision: Decision) -> dict[int, str]:
    """The reason of each move the decision makes, by job."""
    return {a.job_id: a.reason for a in plan(cluster, decision) if a.kind is Kind.MOVE}


def test_a_share_job_is_moved_to_free_a_whole_gpu_for_the_head_of_the_queue() -> None:
    cluster = state(gpus(2), share(11, 0), share(12, 1), waiting(9))
    decision = decide(cluster)
    assert moves(cluster, decision) == {11: "moved to GPU 1: frees GPU 0 for job 9"}
    assert decision.bindings[11] == ("GPU-1",)
    assert decision.bindings[12] == ("GPU-1",)  # stays where it is
    starts, waiting_reasons = placements(cluster, decision)
    assert starts == [] and waiting_reasons[9] == RELEASE_WAIT  # job 11 still holds GPU 0
    moving = state(gpus(2), share(11, 1), share(12, 1), waiting(9))  # as the daemon shows it
    starts, _ = placements(moving, decision)
    assert starts == [Placement(9, ("GPU-0",))]


def test_no_job_is_moved_when_the_waiting_job_fits_as_it_is() -> None:
    cluster = state(gpus(3), share(11, 0), share(12, 1), waiting(9))
    decision = decide(cluster)
    assert moves(cluster, decision) == {}
    assert decision.bindings[9] == ("GPU-2",)


@pytest.mark.parametrize(
    ("blocker", "why"),
    [
        (share(11, 0, preemptible=False), "the caller cannot checkpoint it"),
        (share(11, 0, start=NOW - 10), "it started 10 s ago"),
        (share(11, 0, moved_at=NOW - 10), "it was moved 10 s ago"),
        (share(11, 0, mem=12 * G), "it fits on no other GPU"),
    ],
)
def test_a_job_that_may_not_or_cannot_move_is_left_and_the_head_waits(
    blocker: JobView, why: str
) -> None:
    cluster = state(gpus(2), blocker, share(12, 1, preemptible=False), waiting(9))
    decision = decide(cluster)
    assert moves(cluster, decision) == {}, why
    assert decision.notes[9] == "waiting for 1 free GPU (0 free)"


def test_moves_are_all_or_nothing() -> None:
    # Job 9 needs two whole GPUs; only GPU 0 can be emptied (job 12 may not move): no move.
    cluster = state(gpus(2), share(11, 0), share(12, 1, preemptible=False), waiting(9, 2))
    assert moves(cluster, decide(cluster)) == {}


def test_moves_empty_the_gpus_that_need_the_fewest() -> None:
    cluster = state(gpus(3), share(11, 0), share(12, 0), share(13, 1), share(14, 2), waiting(9))
    decision = decide(cluster)
    # GPU 1 holds one job, GPU 0 two: job 13 goes to the fullest shared GPU it fits on.
    assert moves(cluster, decision) == {13: "moved to GPU 0: frees GPU 1 for job 9"}
    assert decision.bindings[9] == ("GPU-1",)


def test_shares_are_moved_onto_shared_gpus_never_onto_a_free_one() -> None:
    cluster = state(gpus(3), share(11, 0), share(12, 1), waiting(9, 2))
    decision = decide(cluster)
    assert moves(cluster, decision) == {11: "moved to GPU 1: frees GPU 0 for job 9"}
    assert decision.bindings[9] == ("GPU-0", "GPU-2")


def test_a_large_share_gets_room_too() -> None:
    cluster = state(
        gpus(2), share(11, 0, mem=6 * G), share(12, 1, mem=6 * G), waiting(9, mem=12 * G)
    )
    decision = decide(cluster)
    assert moves(cluster, decision) == {11: "moved to GPU 1: frees GPU 0 for job 9"}
    assert decision.bindings[9] == ("GPU-0",)


def test_moves_serve_only_the_head_of_the_queue() -> None:
    # Job 8, first in the queue, needs 3 GPUs of 2: it can never run; it is not the head.
    # Job 9 is the head; job 10, behind it, would fit after a move but gets none.
    cluster = state(
        gpus(2), share(11, 0), share(12, 1, preemptible=False), waiting(9, 2), waiting(10)
    )
    decision = decide(cluster)
    assert moves(cluster, decision) == {}
    assert decision.notes[10] == "waiting for 1 free GPU (0 free)"


def test_moves_can_be_turned_off() -> None:
    cluster = state(gpus(2), share(11, 0), share(12, 1), waiting(9))
    decision = FifoBackfill(moves=False).decide(cluster, NOW)
    assert moves(cluster, decision) == {}


def test_a_job_is_moved_out_of_a_link_group_so_a_two_gpu_job_gets_one_switch() -> None:
    # GPUs 0, 1 share switch a and 2, 3 switch b; 1 and 3 are busy: the free 0 and 2 span both.
    cluster = state(gpus(4, "aabb"), whole(11, 1), whole(12, 3, preemptible=False), waiting(9, 2))
    decision = decide(cluster)
    assert moves(cluster, decision) == {
        11: "moved to GPU 2: frees GPU 1 for job 9, so that its 2 GPUs share a PCIe switch "
        "or NVLink"
    }
    assert decision.bindings[9] == ("GPU-0", "GPU-1")


@pytest.mark.parametrize(
    ("topology", "start"),
    [("", 0.0), ("aabb", NOW - 1)],
    ids=["no topology known", "the job in the way started a second ago"],
)
def test_no_gather_without_topology_or_a_job_that_may_move(topology: str, start: float) -> None:
    cluster = state(
        gpus(4, topology), whole(11, 1, start=start), whole(12, 3, preemptible=False), waiting(9, 2)
    )
    decision = decide(cluster)
    assert moves(cluster, decision) == {}
    assert decision.bindings[9] == ("GPU-0", "GPU-2")


def test_the_gather_picks_the_group_needing_fewest_moves() -> None:
    # Group a (0-2) needs one move (job 11); group b (3-5) needs two.
    cluster = state(gpus(8, "aaabbbcc"), whole(11, 2), whole(12, 4), whole(13, 5), waiting(9, 3))
    decision = decide(cluster)
    assert set(moves(cluster, decision)) == {11}
    assert decision.bindings[9] == ("GPU-0", "GPU-1", "GPU-2")
    # Its new GPU is group b's lone free one, so group c's two free GPUs stay together.
    assert decision.bindings[11] == ("GPU-3",)


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (share(1, 0, start=NOW - SETTLE), True),
        (share(1, 0, start=NOW - SETTLE + 1), False),
        (share(1, 0, moved_at=NOW - SETTLE + 1), False),
        (share(1, 0, preemptible=False), False),
        (JobView(1, 0.0, gpu_uuids=("GPU-0", "GPU-1"), allocation=(2,)), False),
        (JobView(1, 0.0, gpu_uuids=("GPU-0",), allocation=(1,), suspended=True), False),
        (JobView(1, 0.0, gpu_uuids=("GPU-0",), allocation=(1,), packed_with=(2,)), False),
        (waiting(1), False),
    ],
)
def test_which_jobs_are_movable(view: JobView, expected: bool) -> None:
    assert movable(view, NOW, SETTLE) is expected
