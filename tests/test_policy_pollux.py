"""The `pollux` policy's rules (see `gpuq.policies.pollux.policy` for each one).

Most tests use a small population and few generations to stay fast; the
tests marked "default settings" run the policy as configured for the
simulator.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from gpuq.goodput import GoodputFunction, GradParams, PerfParams, SpeedupFunction
from gpuq.policies.interface import (
    ClusterState,
    Decision,
    JobView,
    NodeView,
    capacity_violations,
)
from gpuq.policies.pollux import policy as pollux
from gpuq.policies.pollux.policy import (
    PolluxPolicy,
    gpu_cap,
    keep_current_placements,
    realloc_factor,
    repair_order,
)
from gpuq.policies.pollux.search import (
    SearchProblem,
    SearchResult,
    evaluate,
    feasible,
    job_speedups,
    power_mean,
    search,
)
from gpuq.policies.pollux.tables import SpeedupTables, fair_share, min_nodes_for

NOW = 3600.0

# Perfectly scalable: no sync cost, efficiency 1 at every batch size.
LINEAR = GoodputFunction(PerfParams(0.1, 0.001, 0.0, 0.0, 0.0, 0.0, 1.0), GradParams(0.0, 1.0), 64)
# Scales within a node, poorly across nodes, with a moderate noise scale.
LOCAL = GoodputFunction(
    PerfParams(0.05, 0.002, 0.5, 0.02, 0.01, 0.001, 1.5), GradParams(1.0, 20.0), 64
)
# Slow sync everywhere: barely gains from a second GPU.
POOR = GoodputFunction(PerfParams(0.05, 0.001, 1.0, 0.05, 0.4, 0.02, 1.0), GradParams(1.0, 2.0), 64)


def cluster(*sizes: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"n{i}", gpus) for i, gpus in enumerate(sizes))


def job(job_id: int, model: GoodputFunction | None = LINEAR, /, **fields: object) -> JobView:
    """An adaptive job submitted an hour before NOW that has explored up to 32 GPUs."""
    base = JobView(
        id=job_id,
        submit_time=0.0,
        init_batch_size=64,
        max_batch_size=64 * 64,
        local_bsz_bounds=(1, 64),
        adaptive=True,
        max_profiled_gpus=32,
        goodput=model,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def fast(**options: object) -> PolluxPolicy:
    return PolluxPolicy(population=16, generations=30, **options)  # type: ignore[arg-type]


def gpus_of(decision: Decision, job_id: int) -> int:
    return sum(decision.allocations.get(job_id, ()))


def assert_valid(state: ClusterState, decision: Decision, policy: PolluxPolicy) -> None:
    """Capacity, interference avoidance, per-job caps and minimums all hold."""
    assert capacity_violations(state, decision) == []
    spans = {i: 0 for i in range(len(state.nodes))}
    for allocation in decision.allocations.values():
        used = [i for i, count in enumerate(allocation) if count]
        if len(used) > 1:
            for i in used:
                spans[i] += 1
    assert max(spans.values(), default=0) <= 1, "two multi-node jobs share a node"
    for view in state.jobs:
        allocation = decision.allocations.get(view.id, ())
        least = view.min_gpus
        cap = max(gpu_cap(view, state.total_gpus, policy.max_gpu_factor), least)
        assert sum(allocation) <= cap
        assert sum(allocation) == 0 or sum(allocation) >= least, "below the job's minimum"
        assert sum(1 for count in allocation if count) <= 16


# FITNESS_p ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("speedups", "p", "expected"),
    [
        ([1.0, 3.0], 1.0, 2.0 + 1e-3),
        ([1.0, 3.0], -1.0, 2 / (1 / 1.001 + 1 / 3.001)),
        ([1.0, 4.0], 0.0, math.sqrt(1.001 * 4.001)),
        ([2.0, 2.0, 2.0], -1.0, 2.001),
        ([0.5, 2.0, 8.0], -200.0, 0.501 * 3 ** (1 / 200)),
        ([0.0, 5.0], -1.0, 2 / (1 / 1e-3 + 1 / 5.001)),
    ],
)
def test_fitness_is_the_power_mean_with_the_artifact_guard(
    speedups: list[float], p: float, expected: float
) -> None:
    assert power_mean(np.array(speedups), p) == pytest.approx(expected, rel=1e-9)


def test_very_negative_p_approaches_the_minimum() -> None:
    speedups = np.array([0.7, 1.5, 3.0, 9.0])
    means = [float(power_mean(speedups, p)) for p in (-1.0, -10.0, -100.0, -1000.0)]
    assert means == sorted(means, reverse=True)
    assert means[-1] == pytest.approx(0.701, rel=2e-3)


# REALLOC_FACTOR -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("age", "restarts", "penalty", "expected"),
    [
        (3600.0, 0, 30.0, 3600 / 3630),
        (3600.0, 1, 30.0, 3570 / 3630),
        (3600.0, 10, 30.0, 3300 / 3630),
        (300.0, 5, 30.0, 150 / 330),
        (60.0, 3, 30.0, 0.0),  # more restarts than its age pays for
        (0.0, 0, 30.0, 0.0),  # just submitted
        (0.0, 0, 0.0, 1.0),  # no penalty at all
    ],
)
def test_realloc_factor(age: float, restarts: int, penalty: float, expected: float) -> None:
    assert realloc_factor(age, restarts, penalty) == pytest.approx(expected)


def test_more_past_reallocations_give_a_smaller_factor() -> None:
    factors = [realloc_factor(1800.0, restarts, 30.0) for restarts in range(8)]
    assert all(a > b for a, b in itertools.pairwise(factors))


def test_the_job_with_more_reallocations_is_the_one_left_in_place() -> None:
    # Two identical scalable jobs hold one GPU each; two GPUs are free. Growing
    # either is a reallocation, and the frequently restarted one pays more for it.
    state = ClusterState(
        cluster(4),
        (
            job(1, allocation=(1,), num_restarts=0, submit_time=NOW - 300),
            job(2, allocation=(1,), num_restarts=5, submit_time=NOW - 300),
        ),
    )
    decision = fast().decide(state, NOW)
    assert decision.allocations[2] == (1,)
    assert decision.allocations[1] == (3,)


def test_restart_penalty_defaults_to_the_state_and_can_be_overridden() -> None:
    state = ClusterState(cluster(4), (job(1, submit_time=NOW - 60),), restart_penalty=60.0)
    start = {1: (1,)}
    assert fast().fitness(state, NOW, start) == pytest.approx((1 / 4) * 60 / 120 + 1e-3, rel=1e-6)
    assert fast(restart_penalty=0.0).fitness(state, NOW, start) == pytest.approx(
        1 / 4 + 1e-3, rel=1e-6
    )


# Caps and constraints -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_profiled_gpus": 0}, 1),  # never ran: one GPU to start
        ({"max_profiled_gpus": 1}, 2),  # the exploration cap: 2x the most it used
        ({"max_profiled_gpus": 3}, 6),
        ({"max_profiled_gpus": 3, "max_gpus": 4}, 4),  # the user's limit
        ({"max_profiled_gpus": 40}, 64),  # the cluster
        ({"max_profiled_gpus": 40, "local_bsz_bounds": (256, 512)}, 16),  # 4096 // 256
        ({"max_profiled_gpus": 40, "adaptive": False, "batch_size": 512}, 64),  # 512 // 1
        (
            {
                "max_profiled_gpus": 40,
                "adaptive": False,
                "batch_size": 512,
                "local_bsz_bounds": (64, 64),
            },
            8,
        ),
        ({"max_profiled_gpus": 4, "local_bsz_bounds": (8192, 8192)}, 1),  # at least one
    ],
)
def test_gpu_cap(fields: dict[str, object], expected: int) -> None:
    assert gpu_cap(job(1, **fields), 64, 2) == expected


@pytest.mark.parametrize(("profiled", "most"), [(0, 1), (1, 2), (2, 4), (3, 6)])
def test_a_job_gets_at_most_twice_its_most_gpus_so_far(profiled: int, most: int) -> None:
    state = ClusterState(cluster(4, 4, 4, 4), (job(1, max_profiled_gpus=profiled),))
    assert gpus_of(fast().decide(state, NOW), 1) == most


@pytest.mark.parametrize(
    ("sizes", "split"),
    [
        ((2, 2, 2, 2), [4, 4]),  # two nodes each, no node shared
        ((2, 2, 2), [2, 4]),  # 3 + 3 would put both multi-node jobs on the middle node
    ],
)
def test_no_node_ever_hosts_two_multi_node_jobs(sizes: tuple[int, ...], split: list[int]) -> None:
    state = ClusterState(cluster(*sizes), (job(1), job(2)))
    policy = fast()
    decision = policy.decide(state, NOW)
    assert_valid(state, decision, policy)
    assert sorted([gpus_of(decision, 1), gpus_of(decision, 2)]) == split


def test_the_node_limit_holds_for_a_lone_scalable_job() -> None:
    state = ClusterState(cluster(*[1] * 20), (job(1, max_profiled_gpus=20),))
    decision = fast().decide(state, NOW)
    assert gpus_of(decision, 1) == 16


# Speedup tables -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "jobs", "expected"),
    [
        ((4,) * 16, 160, (1, 1)),
        ((4,) * 16, 10, (2, 7)),
        ((4,) * 16, 1, (16, 64)),
        ((8, 4, 2), 2, (1, 7)),
        ((8, 4, 2), 1, (3, 14)),
    ],
)
def test_fair_share(sizes: tuple[int, ...], jobs: int, expected: tuple[int, int]) -> None:
    assert fair_share(np.array(sizes, dtype=np.int16), jobs) == expected


@pytest.mark.parametrize(("gpus", "expected"), [(0, 0), (1, 1), (8, 1), (9, 2), (14, 3), (15, 4)])
def test_min_nodes_for(gpus: int, expected: int) -> None:
    assert min_nodes_for([2, 8, 4], gpus) == expected


def build(views: tuple[JobView, ...], sizes: tuple[int, ...]) -> NDArray[np.float64]:
    node_gpus = np.array(sizes, dtype=np.int16)
    caps = np.array([gpu_cap(v, int(node_gpus.sum()), 2) for v in views], dtype=np.int16)
    fair = fair_share(node_gpus, len(views))
    return SpeedupTables().build(views, caps, node_gpus, min(16, len(sizes)), fair)


def test_speedup_is_goodput_relative_to_the_fair_share() -> None:
    views = (job(1, LOCAL), job(2, POOR), job(3, LINEAR))
    table = build(views, (4, 4, 4))  # a_f: 4 GPUs on one node
    for row, view in enumerate(views):
        assert view.goodput is not None
        function = SpeedupFunction(
            view.goodput, view.max_batch_size, view.local_bsz_bounds, accumulation=True
        )
        fair = function(1, 4)
        for nodes, gpus in [(1, 1), (1, 3), (2, 2), (2, 5), (3, 3), (3, 9), (3, 12)]:
            assert table[row, nodes, gpus] == pytest.approx(function(nodes, gpus) / fair)


def test_adaptive_speedups_are_exactly_the_speedup_functions_numbers() -> None:
    views = (job(1, LOCAL), job(2, POOR), job(3, LINEAR))
    table = build(views, (4, 4, 4))  # a_f: 4 GPUs on one node
    for row, view in enumerate(views):
        assert view.goodput is not None
        function = SpeedupFunction(
            view.goodput, view.max_batch_size, view.local_bsz_bounds, accumulation=True
        )
        for nodes, gpus in [(1, 1), (1, 4), (2, 5), (2, 8), (3, 9), (3, 12)]:
            assert table[row, nodes, gpus] == function(min(nodes, 2), gpus) / function(1, 4)


def test_placements_that_cannot_exist_have_no_speedup() -> None:
    table = build((job(1, LOCAL),), (4, 4))
    assert table[0, 1, 5] == 0.0  # 5 GPUs do not fit on one node
    assert table[0, 2, 1] == 0.0  # 1 GPU cannot span two nodes
    assert table[0, 0, 0] == 0.0


def test_a_job_without_a_model_is_assumed_perfectly_scalable() -> None:
    table = build((job(1, None), job(2, None), job(3, LOCAL), job(4, LOCAL)), (4, 4, 4, 4))
    # a_f = 4 GPUs, so r GPUs give r / 4, however they are spread.
    for nodes, gpus in [(1, 1), (1, 4), (2, 6), (4, 16)]:
        assert table[0, nodes, gpus] == pytest.approx(gpus / 4)
    state = ClusterState(cluster(4, 4), (job(1, None, max_profiled_gpus=4),))
    assert gpus_of(fast().decide(state, NOW), 1) == 8


def test_a_fixed_batch_job_ignores_gradient_statistics() -> None:
    noisy = replace(LOCAL, grad=GradParams(1.0, 1000.0))
    fixed = {"adaptive": False, "batch_size": 256}
    table = build((job(1, LOCAL, **fixed), job(2, noisy, **fixed)), (4, 4))
    np.testing.assert_allclose(table[0], table[1])


# Whole decisions ------------------------------------------------------------------------


def test_a_perfectly_scalable_lone_job_gets_the_whole_cluster() -> None:
    state = ClusterState(cluster(4, 4, 4, 4), (job(1),))
    decision = fast().decide(state, NOW)
    assert decision.allocations == {1: (4, 4, 4, 4)}


def test_two_identical_jobs_split_evenly_with_default_settings() -> None:
    state = ClusterState(cluster(4, 4), (job(1), job(2)))
    decision = PolluxPolicy().decide(state, NOW)
    assert sorted(decision.allocations.values()) == [(0, 4), (4, 0)]


def test_every_pending_job_starts_before_any_job_grows() -> None:
    views = tuple(job(i, LOCAL, max_profiled_gpus=4) for i in range(6))
    state = ClusterState(cluster(2, 2, 2), views)
    decision = fast().decide(state, NOW)
    assert [gpus_of(decision, i) for i in range(6)] == [1] * 6


def brute_force(policy: PolluxPolicy, state: ClusterState) -> tuple[float, float]:
    """The best fitness and the best minimum speedup over every feasible allocation."""
    jobs, problem = policy.problem(state, NOW)
    nodes, count = problem.base.shape
    columns = list(itertools.product(range(max(problem.node_gpus) + 1), repeat=nodes))
    matrices = np.array(
        [np.array(choice, dtype=np.int16).T for choice in itertools.product(columns, repeat=count)]
    )
    matrices = matrices[feasible(problem, matrices)]
    fitness, _ = evaluate(problem, matrices)
    minimum = job_speedups(problem, matrices).min(axis=1)
    return float(fitness.max()), float(minimum.max())


def test_very_negative_p_maximizes_the_minimum_speedup() -> None:
    views = (job(1, LOCAL), job(2, POOR), job(3, LINEAR))
    state = ClusterState(cluster(2, 2, 1), views, restart_penalty=0.0)
    policy = PolluxPolicy(p=-30.0, population=32, generations=60)
    decision = policy.decide(state, NOW)
    best_fitness, best_minimum = brute_force(policy, state)
    jobs, problem = policy.problem(state, NOW)
    matrix = np.zeros_like(problem.base)
    for row, view in enumerate(jobs):
        matrix[:, row] = decision.allocations.get(view.id, (0, 0, 0))
    assert job_speedups(problem, matrix[None]).min() == pytest.approx(best_minimum)
    assert policy.fitness(state, NOW, decision.allocations) == pytest.approx(best_fitness)


@pytest.mark.parametrize("p", [1.0, -1.0])
def test_the_search_finds_the_optimum_of_a_tiny_cluster(p: float) -> None:
    views = (
        job(1, LOCAL, allocation=(1, 0, 0), num_restarts=2, submit_time=NOW - 600),
        job(2, POOR, allocation=(0, 2, 0)),
        job(3, LINEAR, max_profiled_gpus=1),
    )
    state = ClusterState(cluster(2, 2, 1), views)
    policy = PolluxPolicy(p=p, population=32, generations=60)
    decision = policy.decide(state, NOW)
    best_fitness, _ = brute_force(policy, state)
    assert policy.fitness(state, NOW, decision.allocations) == pytest.approx(best_fitness)


def test_a_job_that_keeps_its_count_keeps_its_nodes() -> None:
    views = (job(1, LOCAL, allocation=(0, 2, 0), max_gpus=2), job(2, LOCAL, max_gpus=2))
    state = ClusterState(cluster(2, 2, 2), views)
    decision = fast().decide(state, NOW)
    assert decision.allocations[1] == (0, 2, 0)
    assert gpus_of(decision, 2) == 2


def test_placements_are_restored_when_the_search_only_permutes_nodes() -> None:
    views = (job(1, LOCAL, allocation=(2, 0), max_gpus=2), job(2, LOCAL, max_gpus=1))
    jobs, problem = fast().problem(ClusterState(cluster(2, 2), views), NOW)
    first, second = ([v.id for v in jobs].index(i) for i in (1, 2))
    moved = np.zeros_like(problem.base)
    moved[:, first] = (0, 2)
    assert keep_current_placements(problem, moved)[:, first].tolist() == [2, 0]
    moved[:, second] = (1, 0)  # now job 1's old node is taken: it stays moved
    assert keep_current_placements(problem, moved)[:, first].tolist() == [0, 2]


def test_decide_restores_placements_the_search_permuted(monkeypatch: pytest.MonkeyPatch) -> None:
    def mirrored(problem: SearchProblem, *args: object, **kwargs: object) -> SearchResult:
        result = search(problem, *args, **kwargs)  # type: ignore[arg-type]
        return replace(result, population=result.population[:, ::-1, :].copy())

    monkeypatch.setattr(pollux, "search", mirrored)
    views = (job(1, LOCAL, allocation=(2, 0, 0), max_gpus=2), job(2, LOCAL, max_gpus=1))
    decision = fast().decide(ClusterState(cluster(2, 2, 2), views), NOW)
    assert decision.allocations[1] == (2, 0, 0)


def test_repair_order_serves_least_attained_service_first() -> None:
    views = (
        job(1, attained_service=50.0, submit_time=5.0),
        job(2, attained_service=10.0, submit_time=9.0),
        job(3, attained_service=10.0, submit_time=1.0),
        job(4, attained_service=0.0, submit_time=9.0),
    )
    assert [v.id for v in repair_order(views)] == [4, 3, 2, 1]


# Determinism and robustness --------------------------------------------------------------


def states_over_time() -> list[tuple[ClusterState, float]]:
    """Jobs arriving, running and leaving over a few ticks."""
    nodes = cluster(4, 4, 2)
    models = [LOCAL, POOR, LINEAR, None]
    sequence = []
    for tick in range(5):
        views = tuple(
            job(
                i,
                models[i % 4],
                submit_time=60.0 * i,
                max_profiled_gpus=i % 5,
                attained_service=100.0 * ((i * 7) % 5),
                num_restarts=i % 3,
            )
            for i in range(tick, tick + 6)
        )
        sequence.append((ClusterState(nodes, views), 600.0 + 60.0 * tick))
    return sequence


def run(policy: PolluxPolicy) -> list[Decision]:
    decisions = []
    for state, now in states_over_time():
        decisions.append(policy.decide(state, now))
        assert_valid(state, decisions[-1], policy)
    return decisions


def test_decisions_are_deterministic_for_a_seed() -> None:
    assert run(fast(seed=3)) == run(fast(seed=3))


def test_an_empty_state_gets_an_empty_decision() -> None:
    assert fast().decide(ClusterState(cluster(4), ()), NOW) == Decision()


@pytest.mark.parametrize(
    "options",
    [{"p": math.inf}, {"population": 1}, {"generations": -1}, {"patience": 0}],
)
def test_bad_settings_are_rejected(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be|need"):
        PolluxPolicy(**options)  # type: ignore[arg-type]


def test_an_allocation_of_the_wrong_length_is_rejected() -> None:
    state = ClusterState(cluster(4, 4), (job(1, allocation=(1,)),))
    with pytest.raises(ValueError, match="allocation has 1 entries"):
        fast().decide(state, NOW)


@st.composite
def cluster_states(draw: st.DrawFn) -> ClusterState:
    """Random nodes and jobs whose current allocations fit (a multi-node job alone)."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    free = list(sizes)
    spanned = [False] * len(sizes)
    views = []
    for job_id in range(draw(st.integers(1, 7))):
        allocation = [0] * len(sizes)
        for node in draw(st.lists(st.integers(0, len(sizes) - 1), max_size=3, unique=True)):
            if free[node] and not spanned[node]:
                allocation[node] = draw(st.integers(1, free[node]))
        used = [i for i, count in enumerate(allocation) if count]
        if len(used) > 1:
            for i in used:
                spanned[i] = True
        for i, count in enumerate(allocation):
            free[i] -= count
        model = draw(st.sampled_from([None, LINEAR, LOCAL, POOR]))
        views.append(
            job(
                job_id,
                model,
                allocation=tuple(allocation) if used else (),
                submit_time=draw(st.floats(0.0, NOW)),
                num_restarts=draw(st.integers(0, 6)),
                attained_service=draw(st.floats(0.0, 1e5)),
                max_profiled_gpus=draw(st.integers(0, 8)),
                max_gpus=draw(st.integers(1, 16)),
                adaptive=draw(st.booleans()),
                batch_size=draw(st.sampled_from([64, 256, 1024])),
                min_gpus=draw(st.sampled_from([0, 0, 1, 2, 3, 5])),
            )
        )
    return ClusterState(tuple(NodeView(f"n{i}", g) for i, g in enumerate(sizes)), tuple(views))


def test_a_job_gets_none_or_at_least_its_minimum_even_unexplored() -> None:
    # A rigid 4-GPU job (the daemon's minimum) that never ran: its exploration
    # cap (1 GPU) is raised to 4, and it never runs on fewer.
    rigid = job(1, None, max_gpus=4, min_gpus=4, max_profiled_gpus=0, adaptive=False)
    small = job(2, LINEAR, allocation=(2,), max_gpus=8)
    state = ClusterState(cluster(8), (rigid, small))
    decision = fast().decide(state, NOW)
    assert sum(decision.allocations.get(1, ())) in (0, 4)
    assert sum(decision.allocations.get(1, ())) == 4  # room for both: it runs
    too_small = ClusterState(cluster(3), (rigid, replace(small, allocation=(2,))))
    decision = fast().decide(too_small, NOW)
    assert 1 not in decision.allocations
    assert decision.notes[1] == "needs 4 GPUs; the cluster has 3"


def test_a_job_held_back_by_exploration_says_so_in_its_note() -> None:
    unexplored = job(1, LINEAR, max_gpus=8, max_profiled_gpus=0)
    explored = job(2, LINEAR, max_gpus=8, max_profiled_gpus=8)
    decision = fast().decide(ClusterState(cluster(16), (unexplored, explored)), NOW)
    assert decision.allocations[1] == (1,)
    assert decision.notes[1].endswith("; 1 of 1-8 GPUs until its runner reports")
    assert decision.notes[2].startswith("speedup ")
    assert "runner" not in decision.notes[2]  # it may have all it asks for
    rigid = job(3, None, max_gpus=4, min_gpus=4, max_profiled_gpus=0, adaptive=False)
    decision = fast().decide(ClusterState(cluster(8), (rigid,)), NOW)
    assert "runner" not in decision.notes[3]  # a rigid job gets its count, not explored
    unmodelled = job(4, None, max_gpus=8, max_profiled_gpus=0, allocation=(1,))
    decision = fast().decide(ClusterState(cluster(8), (unmodelled,)), NOW)
    assert decision.allocations[4] == (1,)
    assert (
        decision.notes[4]
        == "speedup 0.12 over a fair share; 1 of 1-8 GPUs until its runner reports"
    )
    reported = replace(unmodelled, max_profiled_gpus=1)  # on one GPU, with no model
    decision = fast().decide(ClusterState(cluster(8), (reported,)), NOW)
    assert decision.allocations[4] == (2,)
    assert decision.notes[4] == (
        "speedup 0.25 over a fair share by the prior: no throughput model from its runner yet"
        "; at most 2 of 1-8 GPUs (2x the 1 its runner has reported on)"
    )


@settings(max_examples=60, deadline=None)
@given(cluster_states(), st.sampled_from([1.0, -1.0, -10.0]))
def test_decisions_never_exceed_capacity_caps_or_interference(
    state: ClusterState, p: float
) -> None:
    policy = PolluxPolicy(p=p, population=8, generations=5)
    first = policy.decide(state, NOW)
    assert_valid(state, first, policy)
    assert_valid(state, policy.decide(state, NOW + 60), policy)
