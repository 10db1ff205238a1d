"""The `gpuq` policy, rule by rule (see the docstring of gpuq/policies/gpuq/policy.py).

Lab-sized states with GPUs one by one, as the daemon builds them: jobs
that ask for an exact count (`rigid`), a range (`adaptive`) or memory shares
(`share`). Each decision is bound to GPUs as the daemon binds it
(`gpuq.daemon.scheduler.binding`), so the tests read what the daemon would
start, and why the rest waits. The restart charges on the goodput search are
in tests/test_policy_gpuq_charges.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.daemon.scheduler.binding import RELEASE_WAIT, placements
from gpuq.policies.actions import Kind, plan
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.gpuq.policy import GpuqPolicy
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView
from gpuq.policies.pollux.policy import PolluxPolicy
from tests.test_policy_pollux import LINEAR

G = 1024**3
NOW = 1000.0


def gpus(count: int, foreign: tuple[int, ...] = (), node: str = "n1") -> tuple[GpuView, ...]:
    return tuple(
        GpuView(f"GPU-{i}", node, 40 * G, foreign[i] if i < len(foreign) else 0)
        for i in range(count)
    )


def state(*jobs: JobView, count: int = 2, foreign: tuple[int, ...] = ()) -> ClusterState:
    return ClusterState(
        nodes=(NodeView("n1", count),),
        jobs=tuple(sorted(jobs, key=lambda job: job.id)),
        gpus=gpus(count, foreign),
    )


def rigid(job_id: int, count: int = 1, *on: str, **fields: object) -> JobView:
    """A job asking for exactly `count` whole GPUs; running on `on` if given."""
    base = JobView(
        job_id,
        float(job_id),
        gpus_requested=count,
        min_gpus=count,
        max_gpus=count,
        preemptible=bool(on),
    )
    if on:
        base = replace(base, gpu_uuids=on, allocation=(len(on),), start_time=float(job_id))
    return replace(base, **fields)  # type: ignore[arg-type]


def adaptive(job_id: int, low: int, high: int, *on: str, **fields: object) -> JobView:
    """A job asking for `low` to `high` GPUs (`--gpus LOW-HIGH`), with a goodput model."""
    base = rigid(job_id, low, *on, max_gpus=high, adaptive=True)
    model = dict(
        goodput=LINEAR,
        init_batch_size=64,
        max_batch_size=64 * 64,
        local_bsz_bounds=(1, 64),
        max_profiled_gpus=high,
    )
    return replace(base, **{**model, **fields})  # type: ignore[arg-type]


def share(job_id: int, mem: int, *on: str, **fields: object) -> JobView:
    """A job asking for `mem` bytes on one shared GPU (`--gpu-mem`)."""
    return rigid(job_id, 1, *on, gpu_mem=mem, **fields)


def decide(cluster: ClusterState, **options: object) -> Decision:
    policy = GpuqPolicy(population=16, generations=10, **options)  # type: ignore[arg-type]
    return policy.decide(cluster, NOW)


def started(cluster: ClusterState, decision: Decision) -> dict[int, tuple[str, ...]]:
    """The jobs the daemon would start now, on their GPUs."""
    return {p.job_id: p.gpu_uuids for p in placements(cluster, decision)[0]}


def waiting(cluster: ClusterState, decision: Decision) -> dict[int, str]:
    """Why each pending job the daemon would not start waits."""
    return placements(cluster, decision)[1]


# -- priorities -------------------------------------------------------------------------


def test_a_higher_priority_job_is_served_before_older_ones() -> None:
    cluster = state(rigid(1), rigid(2), rigid(3, priority=5), count=1)
    decision = decide(cluster)
    assert started(cluster, decision) == {3: ("GPU-0",)}
    assert waiting(cluster, decision) == {
        1: "waiting for 1 free GPU (0 free)",
        2: "waiting for 1 free GPU (0 free)",
    }


def test_a_higher_priority_job_preempts_the_newest_checkpointable_lower_one() -> None:
    cluster = state(rigid(1, 1, "GPU-0"), rigid(2, 1, "GPU-1"), rigid(3, priority=5), count=2)
    decision = decide(cluster)
    assert set(decision.allocations) == {1, 3}
    assert decision.bindings[3] == ("GPU-1",)
    assert decision.notes[2] == "preempted for job 3 (priority 5 over 0)"
    actions = plan(cluster, decision)
    assert [(a.kind, a.job_id) for a in actions] == [(Kind.SUSPEND, 2), (Kind.START, 3)]
    assert actions[0].reason == "suspended by the policy: preempted for job 3 (priority 5 over 0)"
    # The GPU is still held until job 2 has checkpointed: job 3 waits for it.
    assert waiting(cluster, decision) == {3: RELEASE_WAIT}


def test_the_lowest_priority_goes_first_and_no_more_than_needed() -> None:
    cluster = state(
        rigid(1, 1, "GPU-0", priority=1),
        rigid(2, 1, "GPU-1", priority=0),
        rigid(3, 1, "GPU-2", priority=0),
        rigid(4, priority=5),
        count=3,
    )
    decision = decide(cluster)
    assert set(decision.allocations) == {1, 2, 4}
    assert decision.notes[3] == "preempted for job 4 (priority 5 over 0)"


def test_an_adaptive_job_of_lower_priority_is_shrunk_before_any_job_is_preempted() -> None:
    cluster = state(
        rigid(1, 1, "GPU-0"), adaptive(2, 1, 2, "GPU-1", "GPU-2"), rigid(3, priority=5), count=3
    )
    decision = decide(cluster)
    assert decision.allocations == {1: (1,), 2: (1,), 3: (1,)}
    assert decision.bindings[3] == ("GPU-2",)
    (resize, start) = plan(cluster, decision)
    assert (resize.kind, resize.job_id, start.kind) == (Kind.RESIZE, 2, Kind.START)
    assert resize.reason == "resized 2 -> 1 GPUs: shrunk for job 3 (priority 5 over 0)"


def test_a_job_that_cannot_checkpoint_is_never_preempted() -> None:
    cluster = state(rigid(1, 1, "GPU-0", preemptible=False), rigid(2, priority=5), count=1)
    decision = decide(cluster)
    assert decision.allocations == {1: (1,)}
    assert waiting(cluster, decision) == {2: "waiting for 1 free GPU (0 free)"}


def test_jobs_of_the_same_priority_are_not_preempted_for_one_another() -> None:
    cluster = state(rigid(2, 1, "GPU-0"), rigid(1, submit_time=-5.0), count=1)
    decision = decide(cluster, timeslice="off")
    assert decision.allocations == {2: (1,)}
    assert waiting(cluster, decision) == {1: "waiting for 1 free GPU (0 free)"}


# -- memory shares, exclusive jobs, foreign memory ------------------------------------------


def test_memory_shares_are_packed_exactly_as_fifo_packs_them() -> None:
    cluster = state(
        share(1, 6 * G), share(2, 6 * G), share(3, 30 * G), share(4, 20 * G), rigid(5, 1)
    )
    ours = decide(cluster)
    theirs = FifoBackfill().decide(cluster, NOW)
    assert started(cluster, ours) == started(cluster, theirs)
    assert started(cluster, ours) == {1: ("GPU-0",), 2: ("GPU-0",), 3: ("GPU-1",), 4: ("GPU-0",)}
    assert waiting(cluster, ours) == waiting(cluster, theirs)
    assert ours.notes[1] == "a 6.0G memory share"


def test_shares_never_over_commit_a_gpu_beside_foreign_memory() -> None:
    cluster = state(share(1, 20 * G), share(2, 10 * G), count=1, foreign=(20 * G,))
    decision = decide(cluster)
    assert started(cluster, decision) == {2: ("GPU-0",)}
    assert waiting(cluster, decision) == {
        1: "waiting for 20.0G on a shared GPU (largest free 18.0G)"
    }


def test_foreign_memory_over_the_tolerance_keeps_a_gpu_from_whole_gpu_jobs() -> None:
    cluster = state(rigid(1), adaptive(2, 1, 2), count=2, foreign=(0, 4 * G))
    decision = decide(cluster)
    assert started(cluster, decision) == {1: ("GPU-0",)}
    assert waiting(cluster, decision) == {
        2: "waiting for 1 free GPU (0 free, 1 used by other processes)"
    }


def test_an_exclusive_share_takes_its_gpu_alone() -> None:
    cluster = state(share(1, 6 * G, exclusive=True), share(2, 6 * G), count=1)
    decision = decide(cluster)
    assert started(cluster, decision) == {1: ("GPU-0",)}
    assert waiting(cluster, decision)[2].startswith("waiting for 6.0G on a shared GPU")
    assert decision.notes[1] == "a 6.0G memory share alone"


def test_an_adaptive_job_shrinks_for_a_share_queued_behind_its_minimum() -> None:
    cluster = state(adaptive(1, 1, 2, "GPU-0", "GPU-1"), share(2, 6 * G))
    decision = decide(cluster)
    assert decision.allocations[1] == (1,), "resized 2 -> 1 through its checkpoint"
    assert decision.bindings[2] == ("GPU-1",)
    assert [a.kind for a in plan(cluster, decision)] == [Kind.RESIZE, Kind.START]
    assert waiting(cluster, decision) == {2: RELEASE_WAIT}, "until job 1 leaves GPU-1"


def test_a_share_takes_a_free_gpu_before_one_a_resizable_job_would_give_up() -> None:
    cluster = state(adaptive(1, 1, 3, "GPU-0", "GPU-1"), share(2, 4 * G), count=3)
    decision = decide(cluster)
    assert decision.bindings[2] == ("GPU-2",)
    assert plan(cluster, decision)[0].kind is Kind.START, "job 1 neither moves nor shrinks"


# -- backfill with time limits ------------------------------------------------------------


def test_a_short_job_backfills_around_the_head_and_a_long_one_waits_behind_it() -> None:
    cluster = state(
        rigid(1, 1, "GPU-0", time_limit=3000.0, preemptible=False),
        rigid(2, 2),
        share(3, 6 * G, time_limit=100.0),
        share(4, 6 * G),
    )
    decision = decide(cluster)
    assert started(cluster, decision) == {3: ("GPU-1",)}
    assert waiting(cluster, decision) == {
        2: "waiting for 2 free GPUs (1 free)",
        4: "behind job 2 (reserved GPUs)",
    }


def test_a_large_request_is_not_passed_over_forever_by_small_ones() -> None:
    cluster = state(
        rigid(1, 1, "GPU-0", time_limit=3000.0, preemptible=False),
        rigid(2, 2),
        rigid(3),
        rigid(4),
    )
    decision = decide(cluster, timeslice="off")
    assert started(cluster, decision) == {}
    assert waiting(cluster, decision)[3] == "behind job 2 (reserved GPUs)"


# -- goodput allocation -------------------------------------------------------------------


def test_rigid_jobs_start_in_queue_order_with_a_reason() -> None:
    cluster = state(rigid(2), rigid(1), rigid(3), count=2)
    decision = decide(cluster)
    assert started(cluster, decision) == {1: ("GPU-0",), 2: ("GPU-1",)}
    assert decision.notes[1] == "next in the queue at priority 0"


def test_an_adaptive_job_grows_into_idle_gpus_and_says_what_it_gains() -> None:
    cluster = state(adaptive(1, 1, 4, "GPU-0"), count=4)
    decision = decide(cluster)
    assert sum(decision.allocations[1]) > 1
    (action,) = plan(cluster, decision)
    assert action.kind is Kind.RESIZE
    assert action.reason.startswith(f"resized 1 -> {sum(decision.allocations[1])} GPUs: goodput +")


def test_a_new_adaptive_job_alone_starts_on_one_gpu_and_says_why() -> None:
    # Its runner has not reported yet: Pollux's exploration holds it to one
    # GPU, so its speedup over a fair share of four reads 0.25.
    cluster = state(adaptive(1, 1, 4, max_profiled_gpus=0, goodput=None), count=4)
    decision = decide(cluster)
    assert decision.allocations == {1: (1,)}
    assert decision.notes[1] == (
        "speedup 0.25 over a fair share; 1 of 1-4 GPUs until its runner reports"
    )


def test_a_running_adaptive_job_without_a_checkpoint_keeps_its_gpus_and_says_why() -> None:
    cluster = state(adaptive(1, 1, 4, "GPU-0", preemptible=False), count=4)
    decision = decide(cluster)
    assert decision.allocations == {1: (1,)}
    assert decision.notes[1] == (
        "kept on 1 of 1-4 GPUs: it is resized only through a gpuq.runner checkpoint"
        " and has offered none"
    )


def test_an_adaptive_job_grows_twice_what_its_runner_reported_on_and_says_so() -> None:
    cluster = state(adaptive(1, 1, 8, "GPU-0", max_profiled_gpus=1), count=8)
    (action,) = plan(cluster, decide(cluster))
    assert action.reason.startswith("resized 1 -> 2 GPUs: goodput +")
    assert action.reason.endswith("; at most 2 of 1-8 GPUs (2x the 1 its runner has reported on)")


def test_a_resize_without_a_throughput_model_says_it_is_the_priors() -> None:
    # The runner reported from one GPU but no model (its loader is not adaptive):
    # Pollux's prior takes two GPUs as twice as fast, and the reason says whose claim it is.
    cluster = state(adaptive(1, 1, 8, "GPU-0", max_profiled_gpus=1, goodput=None), count=8)
    (action,) = plan(cluster, decide(cluster))
    assert action.reason == (
        "resized 1 -> 2 GPUs: goodput +100% (speedup 0.25 over a fair share by the prior:"
        " no throughput model from its runner yet); at most 2 of 1-8 GPUs (2x the 1 its"
        " runner has reported on)"
    )


def test_adaptive_jobs_share_the_gpus_by_goodput_with_rigid_ones() -> None:
    cluster = state(adaptive(1, 1, 4, "GPU-0", "GPU-1", "GPU-2", "GPU-3"), rigid(2, 2), count=4)
    decision = decide(cluster)
    assert decision.allocations == {1: (2,), 2: (2,)}
    assert waiting(cluster, decision) == {2: RELEASE_WAIT}


def test_a_running_job_that_cannot_be_preempted_keeps_its_gpus() -> None:
    held = adaptive(1, 1, 4, "GPU-0", "GPU-1", "GPU-2", "GPU-3", preemptible=False)
    cluster = state(held, adaptive(2, 1, 4), count=4)
    decision = decide(cluster)
    assert decision.allocations[1] == (4,)
    assert decision.bindings[1] == held.gpu_uuids
    assert 2 not in decision.allocations


def test_with_one_class_of_jobs_on_any_count_it_decides_as_its_search_alone() -> None:
    # Pollux's workloads: min_gpus 0, no GPU list, no shares, one priority.
    nodes = (NodeView("n0", 4), NodeView("n1", 4))
    jobs = tuple(
        JobView(i, 100.0 * i, goodput=LINEAR, init_batch_size=64, max_batch_size=4096,
                local_bsz_bounds=(1, 64), adaptive=True, max_profiled_gpus=4,
                allocation=(2, 0) if i == 1 else ())
        for i in range(1, 6)
    )  # fmt: skip
    cluster = ClusterState(nodes, jobs)
    ours = GpuqPolicy(seed=3, starts="charged", timeslice="off").decide(cluster, NOW)
    theirs = PolluxPolicy(seed=3).decide(cluster, NOW)
    assert dict(ours.allocations) == dict(theirs.allocations)


# -- time-slicing ---------------------------------------------------------------------------


def test_a_job_waiting_behind_its_own_class_takes_turns_on_a_node() -> None:
    cluster = state(rigid(1, 1, "GPU-0"), rigid(2, 1, "GPU-1"), rigid(3))
    decision = decide(cluster)
    assert decision.allocations == {1: (1,), 2: (1,), 3: (1,)}, "n1 over-subscribed: 3 on 2"
    assert decision.notes[3] == (
        "time-sliced on n1 with jobs 1, 2: jobs of priority 0 waiting for GPUs take turns "
        "(60 s quanta)"
    )
    assert GpuqPolicy().capabilities.time_slicing


def test_without_timeslicing_it_waits() -> None:
    cluster = state(rigid(1, 1, "GPU-0"), rigid(2, 1, "GPU-1"), rigid(3))
    decision = decide(cluster, timeslice="off")
    assert 3 not in decision.allocations
    assert not GpuqPolicy(timeslice="off").capabilities.time_slicing


def test_no_node_is_time_sliced_with_a_job_that_cannot_wait_its_turn() -> None:
    cluster = state(rigid(1, 1, "GPU-0", preemptible=False), rigid(2), count=1)
    assert 2 not in decide(cluster).allocations
    known = state(rigid(1, 1, "GPU-0", preemptible=False, memory_peak=G), rigid(2), count=1)
    assert decide(known).allocations[2] == (1,), "a job of known memory can be stopped"


def test_a_job_is_never_time_sliced_with_another_priority() -> None:
    cluster = state(rigid(1, 1, "GPU-0", priority=5, preemptible=False), rigid(2), count=1)
    assert 2 not in decide(cluster).allocations


def test_a_node_is_over_subscribed_at_most_twice() -> None:
    cluster = state(rigid(1, 1, "GPU-0"), rigid(2), rigid(3), count=1)
    decision = decide(cluster)
    assert decision.allocations == {1: (1,), 2: (1,)}
    assert waiting(cluster, decision)[3] == "waiting for 1 free GPU (0 free)"
    assert decide(cluster, oversubscription=3.0).allocations[3] == (1,)


def test_memory_shares_are_not_time_sliced_and_their_gpus_not_counted() -> None:
    cluster = state(rigid(1, 1, "GPU-0"), share(2, 6 * G, "GPU-1"), rigid(3), rigid(4))
    decision = decide(cluster)
    assert decision.allocations[3] == (1,), "a guest of job 1 on GPU-0"
    assert 4 not in decision.allocations, "GPU-0 alone takes two jobs at most"


def test_a_guest_keeps_its_node_and_starts_for_real_when_a_gpu_frees() -> None:
    # Two nodes counted per node (the simulator): n0 time-sliced (jobs 1, 2 on
    # its one GPU), n1 idle now that its job ended.
    nodes = (NodeView("n0", 1), NodeView("n1", 1))
    jobs = (
        rigid(1, 1, allocation=(1, 0), preemptible=True),
        rigid(2, 1, allocation=(1, 0), preemptible=True),
    )
    decision = GpuqPolicy(population=16, generations=10).decide(ClusterState(nodes, jobs), NOW)
    assert decision.allocations == {1: (1, 0), 2: (0, 1)}, "job 2 moves to the free GPU"
    busy = (*jobs, rigid(3, 1, allocation=(0, 1), preemptible=True), rigid(4))
    again = GpuqPolicy(population=16, generations=10).decide(ClusterState(nodes, busy), NOW)
    assert again.allocations[2] == (1, 0), "the guest stays where its turns are"
    assert again.allocations[4] == (0, 1), "the newcomer goes to the less loaded node"


# -- moves on one server ------------------------------------------------------------------------


def linked(groups: str) -> tuple[GpuView, ...]:
    """GPUs 0..n-1 of 40G, each in the link group its letter names ("aabb": two switches)."""
    return tuple(
        GpuView(f"GPU-{i}", "n1", 40 * G, link_group=group, index=i)
        for i, group in enumerate(groups)
    )


def test_a_share_job_is_moved_so_a_whole_gpu_job_of_its_class_gets_a_free_gpu() -> None:
    cluster = state(share(1, 6 * G, "GPU-0"), share(2, 6 * G, "GPU-1"), rigid(3))
    decision = decide(cluster)
    assert decision.bindings[1] == ("GPU-1",), "onto the other shared GPU"
    assert decision.bindings[3] == ("GPU-0",)
    assert [(a.kind, a.job_id) for a in plan(cluster, decision)] == [
        (Kind.MOVE, 1),
        (Kind.START, 3),
    ]
    assert plan(cluster, decision)[0].reason == "moved to GPU 1: frees GPU 0 for job 3"
    assert waiting(cluster, decision) == {3: RELEASE_WAIT}, "until job 1 has left GPU-0"
    assert decide(cluster, moves=False).bindings == {1: ("GPU-0",), 2: ("GPU-1",)}


def test_only_a_job_that_checkpoints_and_has_run_move_after_seconds_is_moved() -> None:
    plain = state(share(1, 6 * G, "GPU-0", preemptible=False), share(2, 6 * G, "GPU-1"), rigid(3))
    assert decide(plain).bindings[2] == ("GPU-0",), "job 2 moves instead"
    young = state(
        share(1, 6 * G, "GPU-0", start_time=NOW - 10),
        share(2, 6 * G, "GPU-1", start_time=NOW - 10),
        rigid(3),
    )
    assert 3 not in decide(young).allocations
    assert decide(young, move_after=5.0).bindings[3] == ("GPU-0",)
    moved = state(
        share(1, 6 * G, "GPU-0", moved_at=NOW - 10),
        share(2, 6 * G, "GPU-1", moved_at=NOW - 10),
        rigid(3),
    )
    assert 3 not in decide(moved).allocations, "moved a moment ago: not again"


def test_a_job_is_never_moved_for_a_job_of_lower_priority() -> None:
    cluster = state(share(1, 6 * G, "GPU-0", priority=5), share(2, 6 * G, "GPU-1"), rigid(3))
    decision = decide(cluster)
    assert decision.bindings[1] == ("GPU-0",)
    assert decision.bindings[2] == ("GPU-0",), "job 2, of the waiting job's class, moves"
    assert decision.bindings[3] == ("GPU-1",)
    urgent = state(share(1, 6 * G, "GPU-0", priority=5), share(2, 6 * G, "GPU-1", priority=5))
    low = replace(urgent, jobs=(*urgent.jobs, rigid(3)))
    assert decide(low).bindings == {1: ("GPU-0",), 2: ("GPU-1",)}
    high = replace(urgent, jobs=(*urgent.jobs, rigid(3, priority=9)))
    assert decide(high).bindings[3] == ("GPU-0",), "for a higher class, a lower one moves"


def test_a_job_is_moved_out_of_a_link_group_so_a_two_gpu_job_gets_it_whole() -> None:
    jobs = (
        rigid(1, 1, "GPU-1"),
        rigid(2, 1, "GPU-2", preemptible=False),
        rigid(3, 2),
    )
    cluster = replace(state(*jobs, count=4), gpus=linked("aabb"))
    decision = decide(cluster)
    assert decision.bindings[1] == ("GPU-3",)
    assert decision.bindings[3] == ("GPU-0", "GPU-1"), "both GPUs of switch a"
    move, start = plan(cluster, decision)
    assert (move.kind, start.kind) == (Kind.MOVE, Kind.START)
    assert move.reason == (
        "moved to GPU 3: frees GPU 1 for job 3, so that its 2 GPUs share a PCIe switch or NVLink"
    )


def test_jobs_gpuq_starts_on_several_gpus_get_gpus_of_one_link_group() -> None:
    cluster = replace(state(adaptive(1, 1, 2), count=4), gpus=linked("abba"))
    decision = decide(cluster)
    assert decision.allocations[1] == (2,), "it grows into the idle GPUs"
    assert decision.bindings[1] == ("GPU-1", "GPU-2"), "GPU order alone would span a and b"


# -- packing with introspection ----------------------------------------------------------------


def light(
    job: JobView, step: float = 0.2, *shared: int, util: float = 30.0, mem: int = 8 * G
) -> JobView:
    """`job` as the daemon measures a gpuq.runner job (a light one by default).

    Its step time (alone, or beside `shared`), its utilization alone, its memory peak.
    """
    return replace(
        job, step_seconds=step, step_shared_with=shared, gpu_utilization=util, memory_peak=mem
    )


def packed_pair(step: float) -> ClusterState:
    """Jobs 1 and 2 packed on GPU-0, each measured at `step` seconds a step beside the other."""
    host = replace(rigid(1, 1, "GPU-0"), packed_with=(2,))
    rider = replace(rigid(2, 1, "GPU-0"), packed_with=(1,))
    return state(light(host, step, 2), light(rider, step, 1), count=1)


def test_a_light_job_waiting_behind_its_class_is_packed_rather_than_time_sliced() -> None:
    policy = GpuqPolicy(population=16, generations=10)
    cluster = state(light(rigid(1, 1, "GPU-0")), light(rigid(2)), count=1)
    decision = policy.decide(cluster, NOW)
    assert decision.packed == ((1, 2),)
    assert decision.allocations == {1: (1,), 2: (1,)}
    assert decision.bindings[2] == ("GPU-0",), "on its host's GPU"
    actions = plan(cluster, decision)
    assert [(a.kind, a.job_id) for a in actions] == [
        (Kind.START, 2),
        (Kind.PACK, 1),
        (Kind.PACK, 2),
    ]
    assert actions[2].reason == "packed with job 1: trial on n1 (utilization 30% + 30%)"
    assert policy.capabilities.packing


@pytest.mark.parametrize(
    ("guest", "why"),
    [
        (light(rigid(2), util=80.0), "busy: 30% + 80% is over 100%"),
        (light(rigid(2), mem=31 * G), "8G + 31G do not fit in 38G"),
        (replace(light(rigid(2)), memory_peak=None), "memory unknown"),
        (replace(light(rigid(2)), step_seconds=None), "never measured alone"),
        (light(rigid(2, exclusive=True)), "asks for its GPU alone"),
        (light(rigid(2, oom_partners=(1,))), "ran out of memory beside job 1 before"),
        (light(adaptive(2, 1, 2)), "it can run on more GPUs"),
    ],
)
def test_a_job_is_packed_only_when_both_are_light_measured_and_fit(
    guest: JobView, why: str
) -> None:
    cluster = state(light(rigid(1, 1, "GPU-0")), guest, count=1)
    decision = decide(cluster)
    assert decision.packed == (), why
    assert decision.notes[2].startswith("time-sliced on n1 with job 1"), "it takes turns instead"


def test_a_job_is_never_packed_with_another_priority_or_without_packing() -> None:
    urgent = light(rigid(1, 1, "GPU-0", priority=5))
    assert decide(state(urgent, light(rigid(2)), count=1)).packed == ()
    same = state(light(rigid(1, 1, "GPU-0")), light(rigid(2)), count=1)
    assert decide(same, packing=False).packed == ()


def test_a_pack_slower_than_time_slicing_is_undone_and_never_tried_again() -> None:
    policy = GpuqPolicy(population=16, generations=10)
    policy.decide(state(light(rigid(1, 1, "GPU-0")), light(rigid(2)), count=1), NOW)
    trial = policy.decide(packed_pair(0.2 / 0.36), NOW + 10)  # 2.8x slower steps beside
    assert trial.packed == ()
    undone = "packed throughput 0.72 of time-sliced (0.36+0.36 of solo), undone on n1"
    assert trial.notes == {1: undone, 2: undone}
    assert trial.allocations == {1: (1,), 2: (1,)}, "back to taking turns"
    reasons = {a.job_id: a.reason for a in plan(packed_pair(0.2 / 0.36), trial)}
    assert reasons == {1: f"unpacked from job 2: {undone}", 2: f"unpacked from job 1: {undone}"}
    again = policy.decide(state(light(rigid(1, 1, "GPU-0")), light(rigid(2)), count=1), NOW + 20)
    assert again.packed == (), "a failed pair is never packed again"


def test_a_pack_is_a_trial_until_both_are_measured_then_kept_while_it_beats_time_slicing() -> None:
    policy = GpuqPolicy(population=16, generations=10)
    policy.decide(state(light(rigid(1, 1, "GPU-0")), light(rigid(2)), count=1), NOW)
    host = replace(light(rigid(1, 1, "GPU-0")), packed_with=(2,))  # no packed sample yet
    rider = replace(light(rigid(2, 1, "GPU-0"), 0.24, 1), packed_with=(1,))
    measuring = policy.decide(state(host, rider, count=1), NOW + 10)
    assert measuring.packed == ((1, 2),)
    assert measuring.notes[2] == "trial, measuring on n1"
    kept = policy.decide(packed_pair(0.24), NOW + 20)  # 1.2x slower steps beside
    assert kept.packed == ((1, 2),)
    assert kept.notes[1] == "kept, 1.67x time-slicing (0.83+0.83 of solo) on n1"
    assert plan(packed_pair(0.24), kept) == (), "nothing changes"


def test_a_pack_ends_when_a_gpu_of_its_own_is_free() -> None:
    policy = GpuqPolicy(population=16, generations=10)
    cluster = replace(packed_pair(0.24), nodes=(NodeView("n1", 2),), gpus=gpus(2))
    decision = policy.decide(cluster, NOW)
    assert decision.packed == ()
    assert decision.notes[2] == "a GPU of its own is free on n1"
    assert {a.kind for a in plan(cluster, decision)} == {Kind.UNPACK}


def test_packing_memory_survives_a_restart() -> None:
    first = GpuqPolicy(population=16, generations=10)
    first.decide(state(light(rigid(1, 1, "GPU-0")), light(rigid(2)), count=1), NOW)
    first.decide(packed_pair(0.2 / 0.36), NOW + 10)
    saved = first.save()
    assert saved["packing"]["failed"] == [[1, 2]]
    restored = GpuqPolicy(population=16, generations=10)
    restored.restore(saved)
    later = state(light(rigid(1, 1, "GPU-0")), light(rigid(2)), count=1)
    assert restored.decide(later, NOW + 20).packed == ()
    fresh = GpuqPolicy(population=16, generations=10)
    fresh.restore({"version": 2, "rng": saved["rng"], "classes": saved["classes"]})
    assert fresh.decide(later, NOW + 20).packed == ((1, 2),), "version 2 knew no packing"


# -- memory between decisions -----------------------------------------------------------------


def two_classes() -> ClusterState:
    return state(
        adaptive(1, 1, 4, "GPU-0", "GPU-1", priority=5),
        adaptive(2, 1, 4, "GPU-2"),
        adaptive(3, 1, 4),
        count=4,
    )


def test_each_class_keeps_its_population_across_a_restart() -> None:
    first = GpuqPolicy(seed=2, population=16, generations=10)
    first.decide(two_classes(), NOW)
    saved = first.save()
    assert set(saved["classes"]) == {"0", "5"}
    restored = GpuqPolicy(seed=2, population=16, generations=10)
    restored.restore(saved)
    later = two_classes()
    assert restored.decide(later, NOW + 60) == first.decide(later, NOW + 60)


def test_a_pollux_format_memory_is_taken_up_as_the_default_class() -> None:
    pollux = PolluxPolicy(population=16, generations=10)
    pollux.decide(two_classes(), NOW)
    policy = GpuqPolicy(population=16, generations=10)
    policy.restore(pollux.save())
    assert set(policy.save()["classes"]) == {"0"}
    with pytest.raises(ValueError, match="unknown version"):
        policy.restore({"version": 7})


# -- every job accounted for, nothing over-committed --------------------------------------------


@st.composite
def lab_states(draw: st.DrawFn) -> ClusterState:
    """A server of 1-4 GPUs with running and pending jobs of every kind and priority."""
    count = draw(st.integers(1, 4))
    foreign = tuple(draw(st.sampled_from([0, 0, 0, 2 * G])) for _ in range(count))
    uuids = [f"GPU-{i}" for i in range(count)]
    free = list(uuids)
    jobs: list[JobView] = []
    for job_id in range(1, draw(st.integers(1, 9))):
        kind = draw(st.sampled_from(["rigid", "adaptive", "share"]))
        fields = {
            "priority": draw(st.sampled_from([0, 0, 3])),
            "preemptible": draw(st.booleans()),
            "time_limit": draw(st.none() | st.just(600.0)),
        }
        runs = draw(st.booleans())
        want = 1 if kind == "share" else draw(st.integers(1, 2))
        on: tuple[str, ...] = ()
        if runs and len(free) >= want:
            on, free = tuple(free[:want]), free[want:]
        if kind == "rigid":
            job = rigid(job_id, want, *on, **fields)
        elif kind == "adaptive":
            job = adaptive(job_id, 1, 3, *on, **fields)
        else:
            job = share(job_id, draw(st.sampled_from([4 * G, 20 * G])), *on, **fields)
        jobs.append(replace(job, preemptible=bool(on) and job.preemptible))
    return state(*jobs, count=count, foreign=foreign)


@settings(max_examples=60, deadline=None)
@given(lab_states(), st.sampled_from(["blocked", "all", "off"]))
def test_every_job_is_placed_or_says_why_and_no_gpu_is_over_committed(
    cluster: ClusterState, timeslice: str
) -> None:
    decision = decide(cluster, timeslice=timeslice)
    assert decide(cluster, timeslice=timeslice) == decision, "deterministic"
    for job in cluster.jobs:
        assert job.id in decision.allocations or decision.notes.get(job.id), job
        if job.gpu_uuids and not job.preemptible:
            assert decision.allocations.get(job.id) == job.allocation, "kept its GPUs"
    # Jobs that stay or move, and jobs started: whole GPUs hold one job, shares fit.
    # (A job resized restarts later, wherever it is placed then.)
    kept = {
        job.id: decision.bindings.get(job.id, job.gpu_uuids)
        for job in cluster.jobs
        if job.gpu_uuids and decision.allocations.get(job.id) == job.allocation
    }
    jobs = {job.id: job for job in cluster.jobs}
    for job_id, uuids in kept.items():
        if set(uuids) != set(jobs[job_id].gpu_uuids):
            assert jobs[job_id].preemptible, f"job {job_id} moved, but it cannot checkpoint"
    kept.update((i, uuids) for i, uuids in decision.bindings.items() if not jobs[i].gpu_uuids)
    for gpu in cluster.gpus:
        on = [jobs[j] for j, uuids in kept.items() if gpu.uuid in uuids]
        whole = [j for j in on if j.gpu_mem is None or j.exclusive]
        assert not whole or len(on) == 1, f"{gpu.uuid}: {[j.id for j in on]}"
        shares = sum(j.gpu_mem or 0 for j in on if j.gpu_mem is not None)
        assert shares <= gpu.memory_total * 0.95 - gpu.memory_foreign


def test_no_job_takes_turns_ahead_of_an_older_one_that_gets_none() -> None:
    # Two one-GPU nodes, each busy: job 3 needs two GPUs on one node, which no
    # node can give in turns; job 4 would fit in turns but does not go first.
    nodes = (NodeView("n0", 1), NodeView("n1", 1))
    jobs = (
        rigid(1, 1, allocation=(1, 0), preemptible=True),
        rigid(2, 1, allocation=(0, 1), preemptible=True),
        rigid(3, 2),
        rigid(4),
    )
    decision = GpuqPolicy(population=16, generations=10).decide(ClusterState(nodes, jobs), NOW)
    assert set(decision.allocations) == {1, 2}
    without_3 = ClusterState(nodes, (jobs[0], jobs[1], jobs[3]))
    decision = GpuqPolicy(population=16, generations=10).decide(without_3, NOW)
    assert decision.allocations[4] in ((1, 0), (0, 1)), "alone, job 4 takes turns"


def test_a_job_whose_minimum_fits_is_left_to_the_search_not_sliced() -> None:
    # Job 1 could shrink to one GPU for job 2; the search holds off (a young
    # job, full cluster, restart charged), and turns do not overrule it.
    cluster = state(adaptive(1, 1, 2, "GPU-0", "GPU-1"), adaptive(2, 1, 2, submit_time=NOW))
    decision = decide(cluster, starts="charged")
    assert decision.allocations == {1: (2,)}
    assert decision.notes[2].startswith("waiting: the goodput allocation keeps the GPUs")
    everyone = decide(cluster, starts="charged", timeslice="all")
    assert everyone.allocations[2] == (1,), "with timeslice=all it takes turns"


def test_jobs_that_run_on_any_count_are_never_sliced_by_default() -> None:
    nodes = (NodeView("n0", 1),)
    jobs = (
        JobView(1, 0.0, allocation=(1,), max_gpus=1),
        JobView(2, NOW, max_gpus=1),
    )
    cluster = ClusterState(nodes, jobs)
    assert 2 not in GpuqPolicy(starts="charged").decide(cluster, NOW).allocations
    sliced = GpuqPolicy(starts="charged", timeslice="all").decide(cluster, NOW)
    assert sliced.allocations[2] == (1,)


def test_an_unknown_timeslice_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="timeslice must be one of blocked, all, off"):
        GpuqPolicy(timeslice="sometimes")
