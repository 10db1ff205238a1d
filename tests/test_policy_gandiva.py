"""The `gandiva` policy, rule by rule (see the docstrings of gpuq/policies/gandiva/).

Sections follow the paper's mechanisms and policy (sections 4.1-4.2). `advance`
below plays the simulator: it applies a decision, time-slices over-subscribed
nodes round-robin, slows packed pairs, and charges restarts.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.gandiva.book import cluster_height, overloaded, server_heights
from gpuq.policies.gandiva.migration import ASSUMED_LOCALITY_SPEEDUP, locality_speedup
from gpuq.policies.gandiva.policy import GandivaPolicy
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView, NodeView
from gpuq.policies.registry import get_policy

G = 1024**3
TICK = 60.0


def cluster(*gpus: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"n{i}", count) for i, count in enumerate(gpus))


def job(job_id: int, gpus: int = 1, on: tuple[int, ...] = (), **fields: object) -> JobView:
    """A job requesting `gpus`, holding `on` (GPUs per node), submitted in id order."""
    defaults: dict[str, object] = {"submit_time": float(job_id), "gpus_requested": gpus}
    defaults.update(fields)
    return JobView(job_id, allocation=on, **defaults)  # type: ignore[arg-type]


def state(nodes: tuple[NodeView, ...], *jobs: JobView, memory: int | None = None) -> ClusterState:
    return ClusterState(nodes, tuple(sorted(jobs, key=lambda j: j.id)), gpu_memory=memory)


def demand(state: ClusterState, decision: Decision) -> list[int]:
    """GPUs used per node under the decision, a packed group's GPU counted once."""
    guests = {j for group in decision.packed for j in sorted(group)[1:]}
    used = [0] * len(state.nodes)
    for job_id, allocation in decision.allocations.items():
        if job_id not in guests:
            used = [u + a for u, a in zip(used, allocation, strict=True)]
    return used


def advance(
    state: ClusterState,
    decision: Decision,
    solo: dict[int, float],
    packed_rate: float = 0.8,
    gone: tuple[int, ...] = (),
) -> ClusterState:
    """The next tick: allocations applied, iterations done at solo x share, restarts charged."""
    used = demand(state, decision)
    packed = {j for group in decision.packed for j in group}
    jobs = []
    for view in state.jobs:
        if view.id in gone:
            continue
        allocation = tuple(decision.allocations.get(view.id, ()))
        slices = zip(state.nodes, allocation or (0,) * len(used), used, strict=True)
        share = min((min(1.0, n.gpus / u) for n, a, u in slices if a), default=0.0)
        seconds = TICK - (state.restart_penalty if allocation != view.allocation else 0.0)
        rate = solo.get(view.id, 1.0) * share * (packed_rate if view.id in packed else 1.0)
        remaining = view.remaining_iterations
        if remaining is not None:
            remaining = max(0.0, remaining - rate * max(0.0, seconds))
        jobs.append(replace(view, allocation=allocation, remaining_iterations=remaining))
    return replace(state, jobs=tuple(jobs))


def nodes_of(decision: Decision, job_id: int) -> list[int]:
    return [i for i, count in enumerate(decision.allocations.get(job_id, ())) if count]


# Bookkeeping: server and cluster height, overload, affinity (section 4.2).


@pytest.mark.parametrize(
    ("allocations", "heights", "height"),
    [
        ([(4, 0), (0, 2)], [1.0, 0.5], 1.0),
        ([(4, 0), (2, 0)], [1.5, 0.0], 1.5),
        ([(2, 2), (0, 4)], [0.5, 1.5], 1.5),
        ([], [0.0, 0.0], 0.0),
    ],
)
def test_server_height_is_allocated_over_total_and_cluster_height_the_highest(
    allocations: list[tuple[int, ...]], heights: list[float], height: float
) -> None:
    jobs = [job(i, sum(a), a) for i, a in enumerate(allocations, 1)]
    view = state(cluster(4, 4), *jobs)
    assert server_heights(view) == heights
    assert cluster_height(view) == height


def test_a_packed_pair_counts_its_shared_gpu_once() -> None:
    view = state(cluster(2), job(1, 1, (1,)), job(2, 1, (1,)))
    assert server_heights(view) == [1.0]
    assert server_heights(view, packed=[(1, 2)]) == [0.5]


@pytest.mark.parametrize(
    ("requests", "expected"), [((4, 4), False), ((4, 4, 1), True), ((), False)]
)
def test_overload_means_jobs_request_more_gpus_than_the_cluster_has(
    requests: tuple[int, ...], expected: bool
) -> None:
    assert (
        overloaded(state(cluster(4, 4), *(job(i, g) for i, g in enumerate(requests)))) is expected
    )


def test_affinity_is_set_by_the_first_job_and_reset_when_the_server_empties() -> None:
    policy = GandivaPolicy()
    first = policy.decide(state(cluster(4, 4), job(1, 2)), 0.0)
    assert policy.affinity == {"n0": 2}
    one = job(2, 1, first.allocations[1])
    policy.decide(state(cluster(4, 4), job(1, 2, first.allocations[1]), one), TICK)
    assert policy.affinity == {"n0": 2}, "a later job of another size does not change it"
    policy.decide(state(cluster(4, 4), job(2, 1, first.allocations[1])), 2 * TICK)
    assert policy.affinity == {"n0": 2}, "the first job left, but the server is not empty"
    policy.decide(state(cluster(4, 4)), 3 * TICK)
    assert policy.affinity == {}


# Reactive mode: Algorithm 1, one test per branch, and Figure 7.


def test_branch_1_same_affinity_least_loaded_server_with_room() -> None:
    view = state(
        cluster(4, 4, 4),
        job(1, 1, (1, 0, 0)),
        job(2, 1, (1, 0, 0)),
        job(3, 1, (0, 1, 0)),
        job(9, 1),
    )
    decision = GandivaPolicy().decide(view, 0.0)
    assert decision.allocations[9] == (0, 1, 0)
    assert "branch 1" in decision.notes[9]


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [(2, (0, 0, 2, 0)), (8, (0, 0, 4, 4))],
    ids=["one empty server", "several empty servers"],
)
def test_branch_2_empty_servers_before_relaxing_affinity(
    gpus: int, expected: tuple[int, ...]
) -> None:
    view = state(
        cluster(4, 4, 4, 4), job(1, 1, (2, 0, 0, 0)), job(2, 1, (0, 3, 0, 0)), job(9, gpus)
    )
    decision = GandivaPolicy().decide(view, 0.0)
    assert decision.allocations[9] == expected
    assert "branch 2" in decision.notes[9]


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [(2, (0, 2, 0)), (4, (3, 1, 0))],
    ids=["fullest node with room", "spread over nodes, most free first"],
)
def test_branch_3_any_free_gpus_when_affinity_and_empty_servers_fail(
    gpus: int, expected: tuple[int, ...]
) -> None:
    view = state(
        cluster(4, 4, 4),
        job(1, 1, (1, 0, 0)),
        job(2, 1, (0, 2, 0)),
        job(3, 4, (0, 0, 4)),
        job(9, gpus),
    )
    decision = GandivaPolicy().decide(view, 0.0)
    assert decision.allocations[9] == expected
    assert "branch 3" in decision.notes[9]


def test_branch_4_over_subscribes_the_least_loaded_same_affinity_server() -> None:
    full = [job(1, 1, (4, 0, 0)), job(2, 1, (0, 4, 0)), job(3, 1, (0, 1, 0)), job(4, 4, (0, 0, 4))]
    decision = GandivaPolicy().decide(state(cluster(4, 4, 4), *full, job(9, 1)), 0.0)
    assert decision.allocations[9] == (1, 0, 0)
    assert "branch 4" in decision.notes[9]
    assert all("time-sliced" in decision.notes[j] for j in (1, 9))
    assert "time-sliced" not in decision.notes[4]


@pytest.mark.parametrize(
    "held",
    [
        [job(1, 4, (4, 0)), job(2, 4, (0, 4))],
        [job(1, 1, (4, 0)), job(2, 1, (0, 4)), job(3, 1, (4, 0)), job(4, 1, (0, 4))],
    ],
    ids=["no server of its affinity", "every such server at the 2x limit"],
)
def test_branch_5_queues_the_job_otherwise(held: list[JobView]) -> None:
    decision = GandivaPolicy().decide(state(cluster(4, 4), *held, job(9, 1)), 0.0)
    assert 9 not in decision.allocations
    assert decision.notes[9].startswith("queued (branch 5)")


def test_figure_7_one_gpu_jobs_together_others_apart_over_subscription_balanced() -> None:
    policy, nodes, jobs = GandivaPolicy(), cluster(4, 4, 4, 4), list[JobView]()
    decision = Decision()
    for job_id, gpus in enumerate([1] * 5 + [2, 4] + [1] * 3 + [2] + [1] * 4, 1):
        jobs = [replace(j, allocation=decision.allocations.get(j.id, ())) for j in jobs]
        jobs.append(job(job_id, gpus))
        decision = policy.decide(state(nodes, *jobs), job_id * TICK)
    ones = {j.id for j in jobs if j.gpus_requested == 1}
    per_node = [sum(1 for j in ones if nodes_of(decision, j) == [i]) for i in range(4)]
    assert per_node == [6, 6, 0, 0]
    assert {tuple(nodes_of(decision, j)) for j in (6, 11)} == {(2,)}
    assert nodes_of(decision, 7) == [3]
    assert policy.affinity == {"n0": 1, "n1": 1, "n2": 2, "n3": 4}


# Time-slicing and priorities.


def test_time_sliced_jobs_keep_their_node_and_gpus_across_quanta() -> None:
    policy = GandivaPolicy()
    view = state(cluster(4), *(job(j, 1, (1,)) for j in range(1, 7)))
    first = policy.decide(view, 0.0)
    second = policy.decide(view, TICK)
    assert first.allocations == second.allocations == {j: (1,) for j in range(1, 7)}
    assert all("time-sliced on n0 (6 GPUs of 4)" in note for note in second.notes.values())


def test_a_job_never_over_subscribes_a_server_of_higher_priority_jobs() -> None:
    held = [job(1, 1, (4, 0), priority=5), job(2, 1, (0, 4), priority=0)]
    decision = GandivaPolicy().decide(state(cluster(4, 4), *held, job(9, 1, priority=1)), 0.0)
    assert decision.allocations[9] == (0, 1)
    assert decision.allocations[1] == (4, 0), "the high-priority job is never time-sliced"


@pytest.mark.parametrize(
    ("gpus", "suspended"),
    [(1, [4]), (2, [3, 4])],
    ids=["over-subscribing its affinity server", "preempting another server"],
)
def test_a_higher_priority_job_suspends_lower_priority_ones_instead_of_sharing(
    gpus: int, suspended: list[int]
) -> None:
    held = [job(j, 1, (1,), priority=0) for j in range(1, 5)]
    decision = GandivaPolicy().decide(state(cluster(4), *held, job(9, gpus, priority=3)), 0.0)
    assert decision.allocations[9] == (gpus,)
    assert [j for j in range(1, 5) if j not in decision.allocations] == suspended
    assert all("suspended for higher-priority job 9" in decision.notes[j] for j in suspended)
    assert demand(state(cluster(4), *held), decision) == [4], "nobody is time-sliced"


def test_a_mixed_priority_time_sliced_server_is_repaired_by_moving_the_lower_job() -> None:
    held = [job(1, 2, (2, 0), priority=2), job(2, 2, (2, 0), priority=2), job(3, 2, (2, 0))]
    decision = GandivaPolicy().decide(state(cluster(4, 4), *held), 0.0)
    assert decision.allocations[3] == (0, 2)
    assert decision.allocations[1] == decision.allocations[2] == (2, 0)


# Departures lower the cluster height by migration.


def test_a_departure_moves_a_time_sliced_job_to_the_vacated_gpu() -> None:
    sliced = [job(j, 1, (1, 0)) for j in range(1, 6)]
    view = state(cluster(4, 4), *sliced, job(6, 4, (0, 4)))
    policy = GandivaPolicy()
    policy.decide(view, 0.0)
    decision = policy.decide(replace(view, jobs=tuple(sliced)), TICK)
    assert decision.allocations[5] == (0, 1), "the newest time-sliced job moves"
    assert "migrated n0 (5 GPUs of 4) -> n1: lowers cluster height" in decision.notes[5]
    assert demand(view, decision) == [4, 1]


@pytest.mark.parametrize(
    ("remaining", "moves"),
    [(2_000.0, True), (100.0, False)],
    ids=["1952 s left: 2440 s sliced > 1982 s moved", "52 s left: 65 s sliced < 82 s moved"],
)
def test_a_time_sliced_job_moves_only_if_that_beats_the_restart_penalty(
    remaining: float, moves: bool
) -> None:
    sliced = [job(j, 1, (1, 0), remaining_iterations=remaining) for j in range(1, 6)]
    view = state(cluster(4, 4), *sliced, job(6, 4, (0, 4), remaining_iterations=1e6))
    policy = GandivaPolicy()
    # One tick at 4/5 of 1 it/s measures each job's solo rate; then job 6 leaves.
    view = advance(view, policy.decide(view, 0.0), solo={j: 1.0 for j in range(1, 7)}, gone=(6,))
    decision = policy.decide(view, TICK)
    assert (decision.allocations[5] == (0, 1)) is moves
    assert all(decision.allocations[j] == (1, 0) for j in range(1, 5))


def test_without_migration_time_sliced_jobs_stay_put() -> None:
    view = state(cluster(4, 4), *(job(j, 1, (1, 0)) for j in range(1, 6)))
    decision = GandivaPolicy(migration=False).decide(view, 0.0)
    assert all(decision.allocations[j] == (1, 0) for j in range(1, 6))


# Introspective mode: locality migration and defragmentation (Figure 8).


def figure_8() -> list[JobView]:
    """A 2-GPU multi-job J0-J3 (ids 10-13), three of them split; DeepSpeech (id 1) holds 8."""
    return [
        job(1, 8, (2, 1, 0, 2, 3)),
        job(10, 2, (2, 0, 0, 0, 0)),
        job(11, 2, (0, 1, 1, 0, 0)),
        job(12, 2, (0, 0, 1, 1, 0)),
        job(13, 2, (0, 0, 0, 1, 1)),
        job(20, 2, (0, 2, 0, 0, 0)),
        job(21, 2, (0, 0, 2, 0, 0)),
    ]


def test_figure_8_split_jobs_are_consolidated_once_gpus_free_up() -> None:
    nodes, policy = cluster(4, 4, 4, 4, 4), GandivaPolicy()
    busy = policy.decide(state(nodes, *figure_8()), 0.0)
    assert [len(nodes_of(busy, j)) for j in (10, 11, 12, 13)] == [1, 2, 2, 2]
    decision = policy.decide(state(nodes, *figure_8()[1:]), TICK)
    assert all(len(nodes_of(decision, j)) == 1 for j in (10, 11, 12, 13))
    assert all("locality" in decision.notes[j] for j in (11, 12, 13))
    unmoved = {j: figure_8()[k].allocation for k, j in ((1, 10), (5, 20), (6, 21))}
    assert {j: decision.allocations[j] for j in unmoved} == unmoved


SYNC_BOUND = GoodputFunction(
    PerfParams(0.02, 0.0005, 1.5, 0.3, 0.4, 0.05, 1.0), GradParams(1, 1), 64
)


@pytest.mark.parametrize(("remaining", "moves"), [(1e6, True), (10.0, False)])
def test_a_split_job_moves_only_if_it_saves_more_than_the_restart(
    remaining: float, moves: bool
) -> None:
    split = job(1, 2, (1, 1), batch_size=128, goodput=SYNC_BOUND, remaining_iterations=remaining)
    decision = GandivaPolicy().decide(state(cluster(4, 4), split, job(2, 1, (1, 0))), 0.0)
    assert (decision.allocations[1] == (2, 0)) is moves


def test_locality_speedup_comes_from_the_model_or_is_assumed() -> None:
    split = job(1, 2, batch_size=128, goodput=SYNC_BOUND)
    assert locality_speedup(split, 2, 2) > 1.5
    assert locality_speedup(job(1, 2), 2, 2) == ASSUMED_LOCALITY_SPEEDUP
    assert locality_speedup(split, 2, 1) == 1.0


def fragmented() -> list[JobView]:
    """A 4-GPU job split 2+2; node n1 holds one small job and 3 free GPUs."""
    return [
        job(1, 4, (2, 0, 2)),
        job(2, 1, (1, 0, 0)),
        job(3, 1, (1, 0, 0)),
        job(4, 1, (0, 1, 0)),
        job(5, 1, (0, 0, 1)),
    ]


@pytest.mark.parametrize(("threshold", "defrags"), [(0.75, True), (1.0, False)])
def test_defragmentation_empties_the_emptiest_busy_server_for_a_split_job(
    threshold: float, defrags: bool
) -> None:
    policy = GandivaPolicy(defrag_threshold=threshold)
    decision = policy.decide(state(cluster(4, 4, 4), *fragmented()), 0.0)
    if defrags:
        assert decision.allocations[4] == (0, 0, 1), "moved to a server with fewer free GPUs"
        assert decision.allocations[1] == (0, 4, 0)
        assert "defragment" in decision.notes[4]
    else:
        assert decision.allocations == {j.id: j.allocation for j in fragmented()}


def test_no_defragmentation_when_no_job_would_benefit() -> None:
    held = [j for j in fragmented() if j.id != 1]
    decision = GandivaPolicy().decide(state(cluster(4, 4, 4), *held), 0.0)
    assert decision.allocations == {j.id: j.allocation for j in held}


# Introspective mode: greedy packing, measured, only during overload.

LIGHT = {"gpu_utilization": 20.0, "memory_peak": 4 * G, "remaining_iterations": 1e6}


def packing_run(packed_rate: float, ticks: int, **overrides: object) -> list[Decision]:
    """Two light 1-GPU jobs time-sliced on a 1-GPU server, decided `ticks` times."""
    fields = {**LIGHT, **overrides}
    view = state(cluster(1), job(1, 1, (1,), **fields), job(2, 1, (1,), **LIGHT), memory=16 * G)
    policy, decisions = GandivaPolicy(), []
    for tick in range(ticks):
        decisions.append(policy.decide(view, tick * TICK))
        view = advance(view, decisions[-1], solo={1: 2.0, 2: 1.0}, packed_rate=packed_rate)
    return decisions


def test_a_pair_that_beats_time_slicing_stays_packed() -> None:
    first, trial, verdict, later = packing_run(packed_rate=0.8, ticks=4)
    assert first.packed == (), "jobs are profiled before they are packed"
    assert trial.packed == verdict.packed == later.packed == ((2, 1),)
    assert "trial" in trial.notes[1]
    assert "kept, 1.60x time-slicing (0.80+0.80 of solo)" in verdict.notes[1]


def test_a_pair_that_regresses_is_unpacked_and_never_retried() -> None:
    first, trial, verdict, later = packing_run(packed_rate=0.4, ticks=4)
    assert trial.packed == ((2, 1),)
    assert verdict.packed == later.packed == ()
    assert (
        "packed throughput 0.80 of time-sliced (0.40+0.40 of solo), undone on n0"
        in (verdict.notes[1])
    )
    assert "time-sliced on n0" in later.notes[1]


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpu_utilization": None},
        {"memory_peak": None},
        {"memory_peak": 13 * G},
        {"gpu_utilization": 85.0},
        {"remaining_iterations": None},
    ],
    ids=["unknown utilization", "unknown memory", "memory does not fit", "busy", "unmeasured"],
)
def test_jobs_are_packed_only_when_known_light_and_fitting(overrides: dict[str, object]) -> None:
    assert all(decision.packed == () for decision in packing_run(0.8, 3, **overrides))


def test_the_lowest_utilization_job_goes_onto_the_lowest_utilization_gpu() -> None:
    jobs = [
        job(1, 1, (1, 0, 0), **{**LIGHT, "gpu_utilization": 10.0}),
        job(2, 1, (1, 0, 0), **{**LIGHT, "gpu_utilization": 50.0}),
        job(3, 1, (0, 1, 0), **{**LIGHT, "gpu_utilization": 40.0}),
        job(4, 1, (0, 0, 1), **{**LIGHT, "gpu_utilization": 20.0}),
    ]
    view, policy = state(cluster(1, 1, 1), *jobs, memory=16 * G), GandivaPolicy()
    view = advance(view, policy.decide(view, 0.0), solo={})
    decision = policy.decide(view, TICK)
    assert decision.packed == ((4, 1),)
    assert decision.allocations[1] == (0, 0, 1)
    assert decision.allocations[2] == (1, 0, 0), "no longer time-sliced, so not packed"
    measuring = policy.decide(advance(view, decision, solo={}), 2 * TICK)
    assert "trial, measuring" in measuring.notes[1], "the moved guest restarted: not measured yet"


# Live, the daemon measures step times instead (gpuq.daemon.scheduler.introspect).

MEASURED = {"gpu_utilization": 30.0, "memory_peak": 12 * G}


def measured(view: ClusterState, decision: Decision, slowdown: float) -> ClusterState:
    """The next pass as the daemon sees it: allocations applied, each job's latest step time.

    A job alone takes 0.2 s a step (time waiting for its turn is not in a
    step); beside its packed partner, `slowdown` times longer.
    """
    partners = {j: tuple(sorted(set(g) - {j})) for g in decision.packed for j in g}
    jobs = []
    for job_view in view.jobs:
        beside = partners.get(job_view.id, ())
        jobs.append(
            replace(
                job_view,
                allocation=tuple(decision.allocations.get(job_view.id, ())),
                step_seconds=0.2 * (slowdown if beside else 1.0),
                step_shared_with=beside,
            )
        )
    return replace(view, jobs=tuple(jobs))


def measured_run(slowdown: float, **overrides: object) -> list[Decision]:
    """Two light jobs on one 40G GPU, measured alone, then packed, over four passes."""
    view = state(
        cluster(1),
        job(1, 1, (1,), **{**MEASURED, **overrides}),
        job(2, 1, (1,), **MEASURED),
        memory=38 * G,
    )
    view = measured(view, Decision(allocations={1: (1,), 2: (1,)}), slowdown)
    policy, decisions = GandivaPolicy(), []
    for tick in range(4):
        decisions.append(policy.decide(view, tick * TICK))
        view = measured(view, decisions[-1], slowdown)
    return decisions


def test_measured_step_times_pack_a_light_pair_and_keep_it_while_it_beats_time_slicing() -> None:
    trial, verdict, *_ = measured_run(slowdown=1.25)
    assert trial.packed == verdict.packed == ((2, 1),)
    assert "trial on n0 (utilization 30% + 30%)" in trial.notes[1]
    assert "kept, 1.60x time-slicing (0.80+0.80 of solo)" in verdict.notes[1]


def test_measured_step_times_undo_a_pack_slower_than_time_slicing_for_good() -> None:
    trial, verdict, *later = measured_run(slowdown=2.8)
    assert trial.packed == ((2, 1),)
    assert verdict.packed == () and all(d.packed == () for d in later)
    assert "packed throughput 0.71 of time-sliced (0.36+0.36 of solo)" in verdict.notes[1]


@pytest.mark.parametrize(
    "overrides",
    [{"oom_partners": (2,)}, {"exclusive": True}, {"memory_peak": 27 * G}],
    ids=["ran out of memory beside it", "exclusive", "memory does not fit"],
)
def test_a_pair_that_ran_out_of_memory_or_an_exclusive_job_is_never_packed(
    overrides: dict[str, object],
) -> None:
    assert all(decision.packed == () for decision in measured_run(1.25, **overrides))


def test_no_packing_without_overload() -> None:
    jobs = [job(j, 1, (1, 0), **LIGHT) for j in (1, 2)]
    view, policy = state(cluster(1, 1), *jobs, memory=16 * G), GandivaPolicy(migration=False)
    for tick in range(3):
        decision = policy.decide(view, tick * TICK)
        assert decision.packed == ()
        view = advance(view, decision, solo={})


# Introspective mode: opt-in grow-shrink (Figure 11).


def test_figure_11_an_opt_in_job_grows_onto_idle_gpus_and_shrinks_for_new_jobs() -> None:
    policy = GandivaPolicy(grow_shrink_jobs=frozenset({"resnet"}), grow_idle_period=120.0)
    long = job(1, 1, (1,), application="resnet", max_gpus=4)
    view = state(cluster(4), long, job(2, 1, (1,)), job(3, 2, (2,)))
    events = {1: ("leave", 2), 4: ("leave", 3), 5: ("arrive", 2), 6: ("arrive", 1)}
    sizes = []
    for tick in range(7):
        kind, value = events.get(tick, ("", 0))
        if kind == "leave":
            view = replace(view, jobs=tuple(j for j in view.jobs if j.id != value))
        elif kind == "arrive":
            view = replace(view, jobs=(*view.jobs, job(10 + tick, value)))
        decision = policy.decide(view, tick * TICK)
        sizes.append(sum(decision.allocations[1]))
        view = advance(view, decision, solo={})
    assert sizes == [1, 1, 1, 2, 4, 2, 1]
    assert decision.allocations[15] == (2,) and decision.allocations[16] == (1,)
    assert "shrunk to 1 GPUs" in decision.notes[1]


@pytest.mark.parametrize(
    ("nodes", "others", "opt_in"),
    [
        (cluster(4, 1), [job(2, 1, (0, 1)), job(3, 1, (0, 1))], {"resnet"}),
        (cluster(4, 4), [job(2, 3, (3, 0))], {"resnet"}),
        (cluster(4), [], set()),
    ],
    ids=["cluster not under-utilized", "within one server only", "not opted in"],
)
def test_jobs_grow_only_when_allowed(
    nodes: tuple[NodeView, ...], others: list[JobView], opt_in: set[str]
) -> None:
    policy = GandivaPolicy(migration=False, grow_shrink_jobs=frozenset(opt_in), grow_idle_period=0)
    long = job(1, 1, (1,) + (0,) * (len(nodes) - 1), application="resnet", max_gpus=8)
    decision = policy.decide(state(nodes, long, *others), 0.0)
    assert sum(decision.allocations[1]) == 1


# The policy object and its invariants.


def test_the_policy_is_registered_and_declares_time_slicing() -> None:
    policy = get_policy("gandiva", seed=3)
    assert isinstance(policy, GandivaPolicy)
    assert policy.name == "gandiva"
    assert policy.capabilities == Capabilities(
        time_slicing=True, packing=True, preemption=True, remembers=True
    )


@pytest.mark.parametrize(
    "arguments",
    [{"quantum": 0.0}, {"oversubscription": 0.5}, {"defrag_threshold": 0.0}],
)
def test_bad_parameters_are_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        GandivaPolicy(**arguments)  # type: ignore[arg-type]


@st.composite
def random_states(draw: st.DrawFn) -> ClusterState:
    """Any cluster, including states that break the rules (over the limit, mixed priorities)."""
    nodes = cluster(*draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4)))
    jobs = []
    for job_id in range(1, draw(st.integers(0, 12)) + 1):
        gpus = draw(st.sampled_from([1, 1, 1, 2, 4, 8]))
        shape = draw(st.sampled_from(["waiting", "on one node", "on one node", "anywhere"]))
        held: tuple[int, ...] = ()
        if shape == "anywhere":
            held = tuple(draw(st.integers(0, n.gpus)) for n in nodes)
        elif shape == "on one node":
            at = draw(st.integers(0, len(nodes) - 1))
            held = tuple(gpus if i == at else 0 for i in range(len(nodes)))
        jobs.append(
            job(
                job_id,
                gpus,
                held if sum(held) else (),
                priority=draw(st.sampled_from([0, 0, 3])),
                application=draw(st.sampled_from(["", "grow"])),
                max_gpus=draw(st.sampled_from([1, 4, 8])),
                gpu_utilization=draw(st.sampled_from([None, 10.0, 30.0, 45.0, 80.0])),
                memory_peak=draw(st.sampled_from([None, 2 * G, 8 * G, 12 * G])),
                remaining_iterations=draw(st.sampled_from([None, 50.0, 5e3, 1e5, 1e5])),
            )
        )
    return state(nodes, *jobs, memory=draw(st.sampled_from([None, 16 * G, 16 * G])))


@given(
    view=random_states(),
    seed=st.integers(0, 3),
    rates=st.lists(st.floats(0.1, 3), min_size=12),
    packed_rate=st.sampled_from([0.3, 0.8]),
)
@settings(max_examples=100, deadline=None)
def test_every_decision_respects_the_limit_and_accounts_for_every_job(
    view: ClusterState, seed: int, rates: list[float], packed_rate: float
) -> None:
    options = {"grow_shrink_jobs": frozenset({"grow"}), "grow_idle_period": 60.0, "seed": seed}
    first, second = GandivaPolicy(**options), GandivaPolicy(**options)  # type: ignore[arg-type]
    solo = {j.id: rates[j.id - 1] for j in view.jobs}
    for tick in range(5):
        decision = first.decide(view, tick * TICK)
        assert second.decide(view, tick * TICK) == decision, "deterministic for a seed"
        used = demand(view, decision)
        for node, count in zip(view.nodes, used, strict=True):
            assert count <= 2 * node.gpus, "never beyond the 2x over-subscription limit"
        for group in decision.packed:
            held = {decision.allocations[j] for j in group}
            assert len(group) == 2 and len(held) == 1 and sum(held.pop()) == 1
        for one in view.jobs:
            note = decision.notes[one.id]
            assert (one.id in decision.allocations) != note.startswith("queued"), note
        for i, node in enumerate(view.nodes):
            if used[i] > node.gpus:
                levels = {j.priority for j in view.jobs if i in nodes_of(decision, j.id)}
                assert len(levels) == 1, "time-sliced jobs share one priority"
        done = tuple(j.id for j in view.jobs if j.remaining_iterations == 0.0)
        view = advance(view, decision, solo=solo, packed_rate=packed_rate, gone=done)


@pytest.mark.parametrize(
    ("nodes", "held", "leaves", "where", "note"),
    [
        (cluster(2, 1), [(1, 0), (1, 0), (1, 0), (0, 1)], 3, (1, 0), "unpacked on n0"),
        (
            cluster(1, 1, 1),
            [(1, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)],
            4,
            (0, 0, 1),
            "unpacked and migrated n0 -> n2",
        ),
    ],
    ids=["in place", "onto another node"],
)
def test_a_packed_guest_is_unpacked_when_a_gpu_frees_up(
    nodes: tuple[NodeView, ...],
    held: list[tuple[int, ...]],
    leaves: int,
    where: tuple[int, ...],
    note: str,
) -> None:
    jobs = [job(j, 1, allocation, **LIGHT) for j, allocation in enumerate(held, 1)]
    view, policy = state(nodes, *jobs, memory=16 * G), GandivaPolicy()
    view = advance(view, policy.decide(view, 0.0), solo={})
    packed = policy.decide(view, TICK)
    assert packed.packed == ((2, 1),)
    view = advance(view, packed, solo={}, gone=(leaves,))
    decision = policy.decide(view, 2 * TICK)
    assert decision.packed == ()
    assert decision.allocations[1] == where
    assert f"{note}: a GPU is free" in decision.notes[1]


def test_a_call_with_an_earlier_time_starts_afresh() -> None:
    policy = GandivaPolicy()
    policy.decide(state(cluster(4), job(1, 2)), 100.0)
    assert policy.affinity == {"n0": 2}
    policy.decide(state(cluster(4)), 0.0)
    assert policy.affinity == {}


def test_grow_shrink_jobs_may_be_chosen_by_a_predicate() -> None:
    policy = GandivaPolicy(grow_shrink_jobs=lambda j: j.priority > 0, grow_idle_period=0)
    view = state(cluster(4), job(1, 1, (1,), priority=1), job(2, 1, (0,)))
    assert policy.opts_in(view.jobs[0]) and not policy.opts_in(view.jobs[1])
    assert not GandivaPolicy(grow_shrink=False, grow_shrink_jobs=lambda _: True).opts_in(
        view.jobs[0]
    )
