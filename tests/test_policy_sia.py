"""The `sia` policy's rules (see `gpuq.policies.sia.policy` and the modules it names).

Clusters are named after Sia's default heterogeneous one: 6 nodes of 4 T4
GPUs, 3 of 8 RTX 2080 Ti and 2 of 8 A100 (64 GPUs). Models are synthetic:
LINEAR scales perfectly, so a job's goodput is proportional to its GPUs and
to its type's speed; MODEST gains 28% from a second GPU, and POOR loses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import pytest
from scipy.sparse import csr_array

from gpuq.errors import UsageError
from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.interface import (
    ClusterState,
    Decision,
    JobView,
    NodeView,
    TypeModel,
    capacity_violations,
)
from gpuq.policies.registry import get_policy
from gpuq.policies.sia import solve as sia_solve
from gpuq.policies.sia.configs import current_config, pool_of_nodes, pools_of, standard_configs
from gpuq.policies.sia.goodputs import GoodputMemo, fixed_batch_goodput
from gpuq.policies.sia.matrix import Limits, job_row, restart_factor
from gpuq.policies.sia.policy import SiaPolicy
from gpuq.policies.sia.solve import costs, select

NOW = 3600.0


def perf(speed: float) -> PerfParams:
    """Perfectly scalable step times, `speed` times faster than the T4 baseline."""
    return PerfParams(0.1 / speed, 0.001 / speed, 0.0, 0.0, 0.0, 0.0, 1.0)


def model(speed: float = 1.0) -> GoodputFunction:
    return GoodputFunction(perf(speed), GradParams(0.0, 1.0), 64)


LINEAR = model()
POOR = GoodputFunction(PerfParams(0.05, 0.001, 1.0, 0.05, 0.4, 0.02, 1.0), GradParams(1.0, 2.0), 64)
# Two GPUs of one node give 1.28x one GPU's goodput.
MODEST = GoodputFunction(PerfParams(0.1, 0.001, 0.5, 0.0, 0.05, 0.0, 1.0), GradParams(1.0, 4.0), 64)


def nodes(*groups: tuple[int, int, str]) -> tuple[NodeView, ...]:
    """`(count, gpus, type)` groups of nodes, named by type and number."""
    views = []
    for count, gpus, kind in groups:
        views += [NodeView(f"{kind or 'n'}{i}", gpus, kind) for i in range(count)]
    return tuple(views)


SIA_CLUSTER = nodes((6, 4, "T4"), (3, 8, "RTX2080Ti"), (2, 8, "A100"))


def job(job_id: int, goodput: GoodputFunction | None = LINEAR, /, **fields: Any) -> JobView:
    """An adaptive job submitted an hour before NOW that has run on up to 32 GPUs."""
    base = JobView(
        id=job_id,
        submit_time=0.0,
        init_batch_size=64,
        max_batch_size=64 * 64,
        local_bsz_bounds=(1, 64),
        adaptive=True,
        max_profiled_gpus=32,
        goodput=goodput,
    )
    return replace(base, **fields)


def typed(speeds: dict[str, float | None]) -> dict[str, TypeModel]:
    """A job's per-type models at these speeds (None: nothing known there)."""
    return {
        kind: TypeModel(None if speed is None else model(speed), (1, 64), speed is not None)
        for kind, speed in speeds.items()
    }


def where(state: ClusterState, allocation: tuple[int, ...]) -> set[str]:
    """The GPU types an allocation uses."""
    return {node.gpu_type for node, count in zip(state.nodes, allocation, strict=True) if count}


def decide(state: ClusterState, **options: Any) -> Decision:
    decision = SiaPolicy(**options).decide(state, NOW)
    assert capacity_violations(state, decision) == []
    return decision


# The configuration set ----------------------------------------------------------------


def test_the_default_mixed_cluster_has_sias_19_configurations() -> None:
    pools = pools_of(SIA_CLUSTER)
    configs = standard_configs(pools, max_gpus=64)
    by_type = {
        pool.gpu_type: [(c.nodes, c.gpus) for c in configs if c.pool == index]
        for index, pool in enumerate(pools)
    }
    assert by_type == {
        "T4": [(1, 1), (1, 2), (1, 4), (2, 8), (3, 12), (4, 16), (5, 20), (6, 24)],
        "RTX2080Ti": [(1, 1), (1, 2), (1, 4), (1, 8), (2, 16), (3, 24)],
        "A100": [(1, 1), (1, 2), (1, 4), (1, 8), (2, 16)],
    }
    assert len(configs) == 19


def test_a_cluster_without_types_is_one_pool_and_unequal_nodes_are_split() -> None:
    pools = pools_of(nodes((2, 4, ""), (1, 8, "")))
    assert [(p.gpu_type, p.node_gpus, p.nodes) for p in pools] == [("", 4, (0, 1)), ("", 8, (2,))]
    # A node size that is not a power of two keeps its own size as a configuration.
    configs = standard_configs(pools_of(nodes((2, 6, "X"))), max_gpus=64)
    assert [(c.nodes, c.gpus) for c in configs] == [(1, 1), (1, 2), (1, 4), (1, 6), (2, 12)]


def test_multi_node_configurations_stop_at_max_gpus() -> None:
    configs = standard_configs(pools_of(nodes((32, 4, "T4"))), max_gpus=64)
    assert max(c.gpus for c in configs) == 64


# The ILP -----------------------------------------------------------------------------


TABLE_1 = np.array(
    [
        # (1,1,A) (1,2,A) (1,1,B) (1,2,B) (1,4,B)
        [1.0, 1.5, 1.5, 2.5, 3.5],  # J1
        [1.2, 2.1, 1.0, 1.9, 3.6],  # J2
    ]
)


@pytest.mark.parametrize("p", [1.0, 0.5, -0.5, -1.0])
def test_the_papers_table_1_example(p: float) -> None:
    # One node of 2 GPUs of type A and one of 4 of type B: J1 takes (1, 4, B)
    # and J2 (1, 2, A), as the paper's Table 1 shows, whatever the sign of p.
    gpus = np.array([1, 2, 1, 2, 4])
    pool = np.array([0, 0, 1, 1, 1])
    columns = np.arange(10)
    usage = csr_array((np.tile(gpus, 2).astype(float), (np.tile(pool, 2), columns)), shape=(2, 10))
    jobs = np.repeat([0, 1], 5)
    chosen = select(jobs, TABLE_1.ravel(), usage, np.array([2.0, 4.0]), p, 1.1, 10.0)
    picks = np.flatnonzero(chosen.chosen)
    assert chosen.optimal
    assert [(int(jobs[k]), int(gpus[k % 5]), "AB"[pool[k % 5]]) for k in picks] == [
        (0, 4, "B"),
        (1, 2, "A"),
    ]


def test_a_fractional_relaxation_is_solved_as_an_ilp() -> None:
    # Three GPUs and two jobs that each want two: the LP relaxation places one
    # and half of the other; the ILP places one, the more valuable.
    usage = csr_array(([2.0, 2.0], ([0, 0], [0, 1])), shape=(1, 2))
    chosen = select(np.array([0, 1]), np.array([4.0, 2.0]), usage, np.array([3.0]), -0.5, 1.1, 10.0)
    assert list(chosen.chosen) == [True, False]
    assert chosen.optimal
    assert chosen.message != "the LP relaxation is integral"


def test_an_unplaced_job_costs_lambda_so_every_job_that_fits_is_placed() -> None:
    # With p < 0 a placed job costs G^p <= 1 < lambda_n = 1.1: starting a job
    # always beats growing another.
    assert costs(np.array([1.0, 4.0]), -0.5, 1.1) == pytest.approx([-0.1, -0.6])
    assert costs(np.array([1.0, 4.0]), 1.0, 1.1) == pytest.approx([-2.1, -5.1])
    with pytest.raises(ValueError, match="non-zero"):
        costs(np.array([1.0]), 0.0, 1.1)


def test_on_the_time_limit_without_a_solution_jobs_keep_their_configurations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class NoSolution:
        x = None
        status = 1
        message = "time limit reached"

    monkeypatch.setattr(sia_solve, "milp", lambda *args, **kwargs: NoSolution())
    usage = csr_array(([1.0, 2.0], ([0, 0], [0, 1])), shape=(1, 2))
    fallback = np.array([False, True])
    chosen = select(
        np.array([0, 0]), np.array([1.0, 2.0]), usage, np.array([2.0]), -0.5, 1.1, 1.0, fallback
    )
    assert list(chosen.chosen) == [False, True]
    assert not chosen.optimal


# Goodput and the matrix -------------------------------------------------------------


@pytest.mark.parametrize(
    ("age", "restarts", "penalty", "expected"),
    [
        (3600.0, 0, 30.0, 3600 / 3630),
        (3600.0, 10, 30.0, 3300 / 3630),
        (300.0, 20, 30.0, 0.0),  # more restarts than its age pays for
        (20.0, 5, 30.0, 1.0),  # younger than one restart: not penalized (the artifact)
    ],
)
def test_restart_factor(age: float, restarts: int, penalty: float, expected: float) -> None:
    assert restart_factor(age, restarts, penalty) == pytest.approx(expected)


def row_of(state: ClusterState, job_id: int, **options: Any) -> dict[tuple[str, int, int], float]:
    """Job's row of G as {(type, nodes, GPUs): value}."""
    matrix = SiaPolicy(**options).matrix(state, NOW)
    pools = matrix.columns.pools
    return {
        (pools[c.pool].gpu_type, c.nodes, c.gpus): value for c, value in matrix.row(job_id).items()
    }


def test_g_is_goodput_over_the_rows_smallest_value() -> None:
    # Perfectly scalable, 3x faster on A100: the worst option (1 T4) is 1 and
    # every other is its speedup over it, up to twice its most GPUs so far.
    young = job(
        1, per_type=typed({"T4": 1.0, "A100": 3.0}), max_profiled_gpus=2, submit_time=NOW - 10
    )
    row = row_of(ClusterState(nodes((2, 4, "T4"), (1, 4, "A100")), (young,)), 1)
    assert row == pytest.approx(
        {
            ("T4", 1, 1): 1.0,
            ("T4", 1, 2): 2.0,
            ("T4", 1, 4): 4.0,
            ("A100", 1, 1): 3.0,
            ("A100", 1, 2): 6.0,
            ("A100", 1, 4): 12.0,
        },
        rel=1e-3,
    )


def test_a_job_needing_a_minimum_has_its_minimum_as_the_smallest_value() -> None:
    young = job(1, min_gpus=2, max_profiled_gpus=2, submit_time=NOW - 10)
    row = row_of(ClusterState(nodes((1, 8, "A100")), (young,)), 1)
    assert row == pytest.approx({("A100", 1, 2): 2.0, ("A100", 1, 4): 4.0}, rel=1e-3)


def test_a_job_without_a_model_is_worth_one_on_one_gpu_of_each_type() -> None:
    young = job(1, None, max_profiled_gpus=4, submit_time=NOW - 10)
    assert row_of(ClusterState(SIA_CLUSTER, (young,)), 1) == {
        ("T4", 1, 1): 1.0,
        ("RTX2080Ti", 1, 1): 1.0,
        ("A100", 1, 1): 1.0,
    }
    rigid = replace(young, min_gpus=4, max_gpus=4)
    assert set(row_of(ClusterState(SIA_CLUSTER, (rigid,)), 1).values()) == {4.0}


def test_every_configuration_but_the_current_one_is_scaled_by_the_restart_factor() -> None:
    running = job(1, allocation=(2,), max_profiled_gpus=2, num_restarts=2)
    row = row_of(ClusterState(nodes((1, 8, "A100")), (running,)), 1)
    factor = restart_factor(NOW, 2, 30.0)
    assert row == pytest.approx(
        {("A100", 1, 1): factor, ("A100", 1, 2): 2.0, ("A100", 1, 4): 4.0 * factor}, rel=1e-3
    )


def test_the_batched_rows_are_the_rows_one_job_at_a_time() -> None:
    # `job_rows` builds most rows as matrices; `job_row` is the rule, job by job.
    rng = np.random.default_rng(11)
    for _ in range(40):
        state = random_state(rng)
        if not state.jobs:
            continue
        policy = SiaPolicy()
        matrix = policy.matrix(state, NOW)
        columns = matrix.columns
        limits = Limits(policy.max_growth, policy.max_gpus)
        owner = pool_of_nodes(columns.pools, len(state.nodes))
        for row in matrix.rows:
            view = row.job
            current = (
                current_config(columns.pools, owner, view.allocation) if view.running else None
            )
            single = job_row(
                view, columns, matrix.names, current, limits, GoodputMemo(), row.factor
            )
            assert {int(c): v for c, v in zip(single.columns, single.values, strict=True)} == (
                pytest.approx({int(c): v for c, v in zip(row.columns, row.values, strict=True)})
            )
            assert single.current_column == row.current_column


def test_a_fixed_batch_is_split_as_the_simulator_runs_it() -> None:
    nodes_, gpus = np.array([1, 1, 1, 2]), np.array([1, 2, 4, 8])
    values = fixed_batch_goodput(LINEAR, nodes_, gpus, 256, 0, (1, 64))
    # 256 on one GPU: 64 x 4 with accumulation; on 2 GPUs 64 x 2; on 4, 64 each.
    expected = [
        LINEAR.evaluate(1, 1, 64, 3),
        LINEAR.evaluate(1, 2, 64, 1),
        LINEAR.evaluate(1, 4, 64, 0),
        LINEAR.evaluate(2, 8, 32, 0),
    ]
    assert values == pytest.approx(expected)
    too_many = fixed_batch_goodput(LINEAR, np.array([1]), np.array([4]), 2, 0, (1, 64))
    assert too_many[0] == 0.0  # more GPUs than samples in a batch


def test_a_job_goes_to_its_fastest_type_when_gpus_are_plentiful() -> None:
    state = ClusterState(
        SIA_CLUSTER,
        (job(1, per_type=typed({"T4": 1.0, "RTX2080Ti": 2.0, "A100": 3.0}), max_profiled_gpus=4),),
    )
    decision = decide(state)
    assert where(state, decision.allocations[1]) == {"A100"}
    assert sum(decision.allocations[1]) == 8  # twice its most so far
    assert decision.notes[1] == "sia: 8 A100 GPUs on 1 node"


def test_the_scarce_fast_type_goes_to_the_job_that_gains_most_from_it() -> None:
    cluster = nodes((2, 4, "T4"), (1, 4, "A100"))
    jobs = (
        job(1, per_type=typed({"T4": 1.0, "A100": 1.2}), max_profiled_gpus=2),
        job(2, per_type=typed({"T4": 1.0, "A100": 3.0}), max_profiled_gpus=2),
    )
    state = ClusterState(cluster, jobs)
    decision = decide(state)
    assert where(state, decision.allocations[2]) == {"A100"}
    assert where(state, decision.allocations[1]) == {"T4"}
    assert [sum(decision.allocations[i]) for i in (1, 2)] == [4, 4]


def test_a_caller_that_knows_no_types_gives_the_jobs_own_model() -> None:
    state = ClusterState(nodes((1, 8, "")), (job(1, LINEAR, max_profiled_gpus=2),))
    assert decide(state).allocations[1] == (4,)


def test_a_job_without_a_model_gets_one_gpu_of_some_type() -> None:
    state = ClusterState(SIA_CLUSTER, (job(1, None, max_profiled_gpus=0),))
    decision = decide(state)
    assert sum(decision.allocations[1]) == 1
    needs_four = ClusterState(SIA_CLUSTER, (job(1, None, min_gpus=4, max_profiled_gpus=0),))
    assert sum(decide(needs_four).allocations[1]) == 4  # or exactly its minimum


def test_on_a_type_without_a_model_a_job_is_offered_only_its_smallest_configuration() -> None:
    # Known on T4 (slow), unknown on A100: the A100 offer is 1 GPU worth the
    # row's minimum, so the job scales out on T4 instead.
    cluster = nodes((2, 4, "T4"), (1, 8, "A100"))
    state = ClusterState(
        cluster, (job(1, per_type=typed({"T4": 1.0, "A100": None}), max_profiled_gpus=4),)
    )
    decision = decide(state)
    assert where(state, decision.allocations[1]) == {"T4"}
    assert sum(decision.allocations[1]) == 8


@pytest.mark.parametrize(("profiled", "most"), [(0, 2), (1, 2), (2, 4), (3, 4), (4, 8), (8, 16)])
def test_a_job_at_most_doubles_its_most_gpus_so_far(profiled: int, most: int) -> None:
    state = ClusterState(nodes((4, 8, "A100")), (job(1, max_profiled_gpus=profiled),))
    assert sum(decide(state).allocations[1]) == most


def test_the_batch_limit_and_the_users_limit_cap_a_job() -> None:
    by_batch = job(1, max_profiled_gpus=32, local_bsz_bounds=(512, 1024))  # 4096 // 512
    by_user = job(2, max_profiled_gpus=32, max_gpus=2)
    state = ClusterState(nodes((4, 8, "A100")), (by_batch, by_user))
    decision = decide(state)
    assert (sum(decision.allocations[1]), sum(decision.allocations[2])) == (8, 2)


# Restarts ---------------------------------------------------------------------------


def test_the_restart_factor_keeps_a_running_job_where_moving_gains_little() -> None:
    # MODEST on one GPU; a second GPU is free and helps a little (G = 1.28).
    # A job that has never restarted grows (r = 0.99); one that has restarted
    # 60 times in its hour stays where it is (r = 0.5).
    cluster = nodes((1, 4, "T4"))
    fresh = job(1, MODEST, allocation=(1,), max_profiled_gpus=1)
    assert decide(ClusterState(cluster, (fresh,))).allocations[1] == (2,)
    restarted = replace(fresh, num_restarts=60)
    decision = decide(ClusterState(cluster, (restarted,)))
    assert decision.allocations[1] == (1,)
    assert decision.notes[1] == "sia: 1 T4 GPU on 1 node"


def test_a_jobs_own_restart_penalty_overrides_the_states() -> None:
    cluster = nodes((1, 4, "T4"))
    cheap = job(1, MODEST, allocation=(1,), max_profiled_gpus=1, num_restarts=60)
    assert decide(ClusterState(cluster, (cheap,))).allocations[1] == (1,)
    assert decide(ClusterState(cluster, (replace(cheap, restart_penalty=1.0),))).allocations[1] == (
        2,
    )


def test_a_job_that_restarted_more_than_its_age_pays_for_waits() -> None:
    state = ClusterState(nodes((1, 4, "T4")), (job(1, submit_time=NOW - 300, num_restarts=20),))
    decision = decide(state)
    assert 1 not in decision.allocations
    assert decision.notes[1].startswith("waiting")


# Constraints ------------------------------------------------------------------------


def test_a_job_constrained_to_some_nodes_runs_only_there() -> None:
    state = ClusterState(
        SIA_CLUSTER,
        (
            job(
                1,
                per_type=typed({"T4": 1.0, "RTX2080Ti": 1.0, "A100": 3.0}),
                nodes=frozenset({"T40", "T41"}),
                max_profiled_gpus=8,
            ),
        ),
    )
    allocation = decide(state).allocations[1]
    used = {node.name for node, count in zip(state.nodes, allocation, strict=True) if count}
    assert used <= {"T40", "T41"}
    assert sum(allocation) == 8


def test_a_job_that_cannot_be_preempted_keeps_exactly_its_gpus() -> None:
    cluster = nodes((2, 4, "T4"))
    # Split over two nodes (no configuration of Sia's): its GPUs are taken out
    # of the problem, leaving 3 on each node, where the largest configuration
    # of a 4-GPU node that fits is 2 GPUs.
    stuck = job(1, allocation=(1, 1), preemptible=False, max_profiled_gpus=2)
    waiting = job(2, max_profiled_gpus=8)
    decision = decide(ClusterState(cluster, (stuck, waiting)))
    assert decision.allocations[1] == (1, 1)
    assert decision.notes[1] == "sia: not preemptible; keeps its 2 GPUs"
    assert sum(decision.allocations[2]) == 2


def test_a_job_whose_only_nodes_are_held_waits_with_a_reason() -> None:
    cluster = nodes((2, 2, ""))
    held = job(7, allocation=(0, 2), preemptible=False)
    constrained = job(1, None, min_gpus=1, max_gpus=1, nodes=frozenset({"n1"}))
    decision = decide(ClusterState(cluster, (held, constrained)))
    assert decision.allocations[7] == (0, 2)
    assert 1 not in decision.allocations
    assert decision.notes[1] == "waiting: no configuration of 1 GPUs or more has room"


def test_a_job_needing_more_than_its_nodes_have_says_so() -> None:
    cluster = nodes((2, 2, ""))
    big = job(1, None, min_gpus=3, max_gpus=3, nodes=frozenset({"n1"}))
    decision = decide(ClusterState(cluster, (big,)))
    assert decision.notes[1] == "waiting: needs 3 GPUs; n1 has 2"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"min_gpus": 3, "max_gpus": 3, "gpus_requested": 3}, [(3,)]),  # exactly 3 on one node
        ({"min_gpus": 8, "max_gpus": 8, "spread": 2}, [(4, 4)]),  # the same count on 2 nodes
        ({"min_gpus": 16, "max_gpus": 16, "spread": 2}, [(8, 8)]),  # whole nodes
        ({"min_gpus": 2, "max_gpus": 2, "spread": 1}, [(2,)]),
    ],
)
def test_rigid_jobs_get_exactly_their_count_and_shape(
    fields: dict[str, Any], expected: list[tuple[int, ...]]
) -> None:
    state = ClusterState(nodes((3, 8, "A100")), (job(1, None, adaptive=False, **fields),))
    allocation = decide(state).allocations[1]
    assert [tuple(count for count in allocation if count)] == expected


def test_a_job_with_a_minimum_gets_none_or_at_least_it() -> None:
    state = ClusterState(
        nodes((1, 8, "A100")),
        (job(1, min_gpus=4, max_profiled_gpus=0), job(2, allocation=(6,), max_profiled_gpus=6)),
    )
    decision = decide(state)
    assert sum(decision.allocations.get(1, ())) in (0, 4, 8)
    assert sum(decision.allocations[1]) == 4


def test_a_spread_job_that_fits_no_shape_waits() -> None:
    state = ClusterState(nodes((3, 8, "A100")), (job(1, None, min_gpus=6, max_gpus=6, spread=4),))
    decision = decide(state)
    assert 1 not in decision.allocations
    assert decision.notes[1].startswith("waiting")


# Placement --------------------------------------------------------------------------


def test_an_unchanged_configuration_keeps_its_exact_gpus() -> None:
    state = ClusterState(
        nodes((2, 4, "T4")),
        (job(1, None, allocation=(0, 2), min_gpus=2, max_gpus=2),),
    )
    assert decide(state).allocations[1] == (0, 2)  # best fit alone would pick the first node


def test_single_node_jobs_go_best_fit() -> None:
    cluster = nodes((3, 4, "T4"))
    jobs = (
        job(1, None, allocation=(1, 0, 0), min_gpus=1, max_gpus=1),
        job(2, None, allocation=(0, 0, 3), min_gpus=3, max_gpus=3),
        job(3, None, min_gpus=1, max_gpus=1),
    )
    assert decide(ClusterState(cluster, jobs)).allocations[3] == (0, 0, 1)  # the fullest node


def test_fragmentation_moves_a_smaller_job_to_make_room() -> None:
    # Two one-GPU jobs sit on different nodes; a rigid 4-GPU job needs a whole
    # node, so one of them moves (Sia's placer evicts and places it again).
    cluster = nodes((2, 4, "T4"))
    jobs = (
        job(1, None, allocation=(1, 0), min_gpus=1, max_gpus=1),
        job(2, None, allocation=(0, 1), min_gpus=1, max_gpus=1),
        job(3, None, min_gpus=4, max_gpus=4, submit_time=NOW - 10),
    )
    decision = decide(ClusterState(cluster, jobs))
    assert decision.allocations == {1: (0, 1), 2: (0, 1), 3: (4, 0)}
    assert decision.notes[1] == "sia: 1 T4 GPU on 1 node; moved to make room for another job"
    assert decision.notes[3] == "sia: 4 T4 GPUs on 1 node"


def test_multi_node_jobs_take_whole_nodes() -> None:
    state = ClusterState(
        nodes((4, 4, "T4")), (job(1, max_profiled_gpus=4), job(2, max_profiled_gpus=2))
    )
    decision = decide(state)
    multi = decision.allocations[1]
    assert sorted(count for count in multi if count) == [4, 4]
    assert all(m == 0 or s == 0 for m, s in zip(multi, decision.allocations[2], strict=True))


# The policy as a whole --------------------------------------------------------------


def test_sia_is_in_the_registry_with_its_options() -> None:
    policy = get_policy("sia:p=-1:time_limit=0.5", seed=3)
    assert isinstance(policy, SiaPolicy)
    assert (policy.p, policy.time_limit, policy.lambda_n) == (-1, 0.5, 1.1)
    caps = policy.capabilities
    assert (caps.adaptive_jobs, caps.preemption, caps.multi_node) == (True, True, True)
    assert not caps.remembers and not caps.time_slicing


@pytest.mark.parametrize(
    "options",
    [{"p": 0.0}, {"p": math.nan}, {"lambda_n": -1.0}, {"max_growth": 0}, {"time_limit": 0.0}],
)
def test_bad_settings_are_rejected(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be|need"):
        SiaPolicy(**options)


def test_an_empty_state_gets_an_empty_decision() -> None:
    assert SiaPolicy().decide(ClusterState(SIA_CLUSTER, ()), NOW) == Decision()


def test_an_allocation_of_the_wrong_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="allocation has 1 entries"):
        SiaPolicy().decide(ClusterState(nodes((2, 4, "")), (job(1, allocation=(1,)),)), NOW)


def test_positive_p_maximizes_total_normalized_goodput() -> None:
    # Two perfectly scalable jobs, one 8-GPU node: any split sums to the same
    # goodput with p = 1, while p = -0.5 splits evenly.
    cluster = nodes((1, 8, "A100"))
    jobs = (job(1, max_profiled_gpus=8), job(2, max_profiled_gpus=8))
    even = decide(ClusterState(cluster, jobs))
    assert [sum(even.allocations[i]) for i in (1, 2)] == [4, 4]
    total = decide(ClusterState(cluster, jobs), p=1.0)
    assert sum(sum(a) for a in total.allocations.values()) == 8


# Properties over random states ------------------------------------------------------

TYPES = ("T4", "A100")

T = TypeVar("T")


def pick(rng: np.random.Generator, options: Sequence[T]) -> T:
    return options[int(rng.integers(len(options)))]


def random_state(rng: np.random.Generator) -> ClusterState:
    """Random typed nodes and jobs; running jobs fit, on one type, at any shape."""
    cluster = tuple(
        NodeView(f"n{i}", pick(rng, [1, 2, 4, 8]), pick(rng, TYPES))
        for i in range(int(rng.integers(1, 7)))
    )
    free = [node.gpus for node in cluster]
    jobs = []
    for job_id in range(int(rng.integers(0, 12))):
        allocation: tuple[int, ...] = ()
        if rng.random() < 0.5:
            kind = pick(rng, TYPES)
            wanted = [
                int(rng.integers(0, f + 1)) if node.gpu_type == kind else 0
                for f, node in zip(free, cluster, strict=True)
            ]
            if sum(wanted):
                allocation = tuple(wanted)
                free = [f - w for f, w in zip(free, wanted, strict=True)]
        speeds = {kind: pick(rng, [None, 1.0, 2.5]) for kind in TYPES if rng.random() < 0.8}
        least = pick(rng, [0, 0, 0, 1, 2, 3, 4])
        constrained = rng.random() < 0.2
        jobs.append(
            job(
                job_id,
                pick(rng, [None, LINEAR, POOR]),
                per_type=typed(speeds),
                allocation=allocation,
                submit_time=float(rng.uniform(0, NOW)),
                num_restarts=int(rng.integers(0, 5)),
                max_profiled_gpus=int(rng.integers(0, 9)),
                adaptive=bool(rng.random() < 0.7),
                batch_size=pick(rng, [64, 256, 1024]),
                min_gpus=least,
                max_gpus=pick(rng, [least or 1, 8, 64]),
                spread=pick(rng, [None, None, 1, 2]),
                nodes=frozenset(pick(rng, cluster).name for _ in range(2)) if constrained else None,
                preemptible=bool(rng.random() < 0.85),
                restart_penalty=pick(rng, [None, 10.0, 250.0]),
            )
        )
    return ClusterState(cluster, tuple(jobs))


def check(state: ClusterState, decision: Decision) -> None:
    assert capacity_violations(state, decision) == []
    ids = {view.id for view in state.jobs}
    assert set(decision.allocations) <= ids
    assert set(decision.notes) == ids
    for view in state.jobs:
        allocation = decision.allocations.get(view.id, ())
        if not view.preemptible and view.running:
            assert allocation == view.allocation
            continue
        if tuple(allocation) == tuple(view.allocation) or not any(allocation):
            continue
        used = [i for i, count in enumerate(allocation) if count]
        assert len(where(state, allocation)) == 1, "spans two GPU types"
        assert sum(allocation) >= max(view.min_gpus, 1)
        assert sum(allocation) <= max(view.max_gpus, view.min_gpus, 1)
        assert all(view.may_run_on(state.nodes[i].name) for i in used)
        if view.spread is not None:
            assert len(used) == view.spread
        counts = {allocation[i] for i in used}
        assert len(counts) == 1, "a new allocation splits unevenly"


def advance(state: ClusterState, decision: Decision) -> ClusterState:
    views = []
    for view in state.jobs:
        allocation = tuple(decision.allocations.get(view.id, ()))
        gpus = sum(allocation)
        views.append(
            replace(
                view,
                allocation=allocation if gpus else (),
                num_restarts=view.num_restarts + (allocation != view.allocation and gpus > 0),
                max_profiled_gpus=max(view.max_profiled_gpus, gpus),
            )
        )
    return replace(state, jobs=tuple(views))


@pytest.mark.parametrize("seed", range(8))
def test_random_states_never_over_commit_span_types_or_break_a_constraint(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(12):
        state = random_state(rng)
        policy, twin = SiaPolicy(), SiaPolicy()
        now = NOW
        for _ in range(3):
            before = repr(state)
            decision = policy.decide(state, now)
            assert repr(state) == before, "the policy mutated its state"
            check(state, decision)
            assert twin.decide(state, now) == decision
            state = advance(state, decision)
            now += 60.0


def test_the_solver_keeps_stdout_clean_while_highs_may_write_to_it(
    capfd: pytest.CaptureFixture[str],
) -> None:
    import os

    from gpuq.policies.sia.solve import quiet_stdout

    print("before", flush=True)
    with quiet_stdout():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution\n")
    print("after", flush=True)
    assert capfd.readouterr().out == "before\nafter\n"


# Starts -------------------------------------------------------------------------------


def stopped_after_restarts() -> ClusterState:
    """A job stopped after 3 restarts of 100 s, 400 s old, on an idle cluster."""
    restarted = job(1, num_restarts=3, submit_time=NOW - 400.0, restart_penalty=100.0)
    return ClusterState(nodes=nodes((1, 4, "T4")), jobs=(restarted,))


def test_sias_restart_factor_keeps_a_job_stopped_after_restarts_waiting_on_idle_gpus() -> None:
    state = stopped_after_restarts()
    assert restart_factor(400.0, 3, 100.0) == pytest.approx(0.2)
    assert decide(state).allocations.get(1, ()) in ((), (0,))


@pytest.mark.parametrize("starts", ["idle", "free"])
def test_with_free_starts_it_starts_on_the_idle_gpus(starts: str) -> None:
    assert sum(decide(stopped_after_restarts(), starts=starts).allocations[1]) >= 1


def test_an_unknown_starts_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="starts must be one of charged, idle, free"):
        SiaPolicy(starts="sometimes")


# The gpuq policy on GPUs of several types -----------------------------------------------


def test_gpuq_sizes_by_type_where_the_gpus_are_of_several_types() -> None:
    state = ClusterState(
        nodes=nodes((1, 4, "T4"), (1, 4, "A100")),
        jobs=(job(1, max_profiled_gpus=4, per_type=typed({"T4": 1.0, "A100": 3.0})),),
    )
    decision = get_policy("gpuq").decide(state, NOW)
    assert where(state, decision.allocations[1]) == {"A100"}
    assert "A100" in decision.notes[1]
    unaware = get_policy("gpuq:types=unaware").decide(state, NOW)
    assert where(state, unaware.allocations[1]) == {"T4", "A100"}  # Pollux takes all 8


def test_gpuq_refuses_an_unknown_types_option() -> None:
    with pytest.raises(UsageError, match="types must be one of aware, sia, unaware"):
        get_policy("gpuq:types=maybe")


# gpuq's rules on top of Sia's --------------------------------------------------------


def test_with_the_prior_a_new_job_is_valued_by_each_types_speed_and_its_count() -> None:
    # T4 1, RTX 2080 Ti 1.41, A100 4.14 (gpuq.gputypes); k GPUs worth k^0.8 of one.
    new = job(1, None, max_profiled_gpus=0, submit_time=NOW - 10)
    row = row_of(ClusterState(SIA_CLUSTER, (new,)), 1, unknown="prior")
    assert row == pytest.approx(
        {
            ("T4", 1, 1): 1.0,
            ("T4", 1, 2): 2**0.8,
            ("RTX2080Ti", 1, 1): 1.41,
            ("RTX2080Ti", 1, 2): 1.41 * 2**0.8,
            ("A100", 1, 1): 4.14,
            ("A100", 1, 2): 4.14 * 2**0.8,
        }
    )
    needs_two = replace(new, min_gpus=2, max_profiled_gpus=2)
    values = row_of(ClusterState(SIA_CLUSTER, (needs_two,)), 1, unknown="prior")
    assert values[("A100", 1, 4)] == pytest.approx(2 * 4.14 * 2**0.8)  # m s (k / m)^0.8


def test_with_the_prior_a_new_job_starts_on_two_gpus_of_the_fastest_free_type() -> None:
    state = ClusterState(SIA_CLUSTER, (job(1, None, max_profiled_gpus=0),))
    assert sum(decide(state).allocations[1]) == 1  # Sia: one GPU of any type
    decision = decide(state, unknown="prior")
    assert where(state, decision.allocations[1]) == {"A100"}
    assert sum(decision.allocations[1]) == 2
    # The same for a job confined to some nodes (rows built one at a time).
    confined = ClusterState(SIA_CLUSTER, (job(1, None, max_profiled_gpus=0, nodes=("T40",)),))
    assert decide(confined, unknown="prior").allocations[1][0] == 2


def test_the_prior_leaves_a_job_with_a_model_alone() -> None:
    known = job(1, per_type=typed({"T4": 1.0, "A100": 3.0}), max_profiled_gpus=2)
    state = ClusterState(SIA_CLUSTER, (known,))
    assert row_of(state, 1, unknown="prior") == row_of(state, 1)


def big_and_new(idle_t4: bool) -> ClusterState:
    """Job 1 holds the 8 A100s; new job 2 gains most from A100s; T4s idle or held."""
    cluster = nodes((1, 8, "A100"), (1, 4, "T4"))
    big = job(1, MODEST, allocation=(8, 0), max_profiled_gpus=8, num_restarts=1)
    new = job(2, per_type=typed({"T4": 1.0, "A100": 4.0}), max_profiled_gpus=1)
    jobs = [big, new]
    if not idle_t4:
        jobs.append(job(3, LINEAR, allocation=(0, 4), max_profiled_gpus=4, preemptible=False))
    return ClusterState(cluster, tuple(jobs))


def test_sia_shrinks_a_running_job_for_a_newcomer_even_with_gpus_idle() -> None:
    decision = decide(big_and_new(idle_t4=True))
    assert decision.allocations[1][0] < 8
    assert decision.allocations[2][0] > 0


def test_with_shrink_idle_no_running_job_loses_gpus_while_one_is_idle() -> None:
    state = big_and_new(idle_t4=True)
    decision = decide(state, shrink="idle")
    assert decision.allocations[1] == (8, 0)
    assert where(state, decision.allocations[2]) == {"T4"}
    # With every GPU held, shrinking is the ILP's call again.
    assert decide(big_and_new(idle_t4=False), shrink="idle").allocations[1][0] < 8


def two_for_one_gpu(served: float) -> ClusterState:
    """One free GPU; job 1 gains a little more from it, job 2 has `served` less service."""
    cluster = nodes((1, 1, "A100"), (1, 1, "T4"))
    busy = job(9, LINEAR, allocation=(0, 1), preemptible=False)
    one = job(1, per_type=typed({"A100": 1.1}), max_profiled_gpus=1, attained_service=served)
    two = job(2, per_type=typed({"A100": 1.0}), max_profiled_gpus=1)
    return ClusterState(cluster, (busy, one, two))


def test_with_service_weights_the_least_served_job_wins_a_contested_gpu() -> None:
    state = two_for_one_gpu(served=36_000.0)
    assert decide(state).allocations.get(1) == (1, 0)  # Sia: the larger gain
    weighted = decide(state, service=3600.0)
    assert weighted.allocations.get(2) == (1, 0)
    assert weighted.allocations.get(1, (0, 0)) == (0, 0)


def test_the_service_floor_bounds_how_far_a_long_served_job_is_discounted() -> None:
    state = two_for_one_gpu(served=36_000.0)  # weight (1 + 10)^-1/2 = 0.30
    assert decide(state, service=3600.0, service_floor=1.0).allocations.get(1) == (1, 0)


def test_weights_scale_each_jobs_costs_in_the_ilp() -> None:
    jobs = np.array([0, 1])
    usage = csr_array(np.array([[1.0, 1.0]]))
    values = np.array([4.0, 2.0])  # job 0 gains more from the one GPU
    capacity = np.array([1.0])
    assert select(jobs, values, usage, capacity, -0.5, 1.1, 1.0).chosen.tolist() == [True, False]
    weights = np.array([0.2, 1.0])
    chosen = select(jobs, values, usage, capacity, -0.5, 1.1, 1.0, weights=weights).chosen
    assert chosen.tolist() == [False, True]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unknown": "guess"}, "unknown must be one of smallest, prior"),
        ({"shrink": "never"}, "shrink must be one of any, idle"),
        ({"service": -1.0}, "service must be"),
        ({"service_floor": 1.5}, "service_floor must be"),
    ],
)
def test_bad_gpuq_rule_settings_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SiaPolicy(**options)


def test_gpuq_applies_its_rules_and_types_sia_does_not() -> None:
    state = ClusterState(SIA_CLUSTER, (job(1, None, max_profiled_gpus=0),))
    ours = get_policy("gpuq").decide(state, NOW).allocations[1]
    assert (where(state, ours), sum(ours)) == ({"A100"}, 2)
    assert sum(get_policy("gpuq:types=sia").decide(state, NOW).allocations[1]) == 1


def test_curves_prefilled_together_equal_curves_evaluated_one_by_one() -> None:
    models = [model(speed) for speed in (1.0, 2.5, 4.0)] + [POOR, MODEST]
    jobs = [job(i, m) for i, m in enumerate(models)]
    nodes_, gpus = np.array([1, 1, 1, 2]), np.array([1, 2, 4, 8])
    together, alone = GoodputMemo(), GoodputMemo()
    curves = [together.curve(j, m, (1, 64)) for j, m in zip(jobs, models, strict=True)]
    together.prefill((curve, 0, 0, nodes_, gpus) for curve in curves)
    for j, m, curve in zip(jobs, models, curves, strict=True):
        expected = alone.curve(j, m, (1, 64)).values(nodes_, gpus)
        assert np.array_equal(curve.standard(0, 0, nodes_, gpus), expected)
