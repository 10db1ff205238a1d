"""The `afs` and `afs-p` policies on cluster states.

The rules are in the docstring of gpuq/policies/afs/policy.py; the algorithms on
tables are tested in test_policy_afs.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.errors import UsageError
from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.afs.core import AfsJob, afs_l
from gpuq.policies.afs.policy import DEFAULT_UNIT, AfsPolicy, AfsPPolicy
from gpuq.policies.baselines import fixed_batch_step_time
from gpuq.policies.interface import (
    Capabilities,
    ClusterState,
    Decision,
    JobView,
    NodeView,
    capacity_violations,
)
from gpuq.policies.registry import get_policy

GRAD = GradParams(sqr=1.0, var=1.0)
SCALES = GoodputFunction(PerfParams(0.05, 0.01, 0.2, 0.01, 0.02, 0.001, 1.0), GRAD, 64)
SYNC_BOUND = GoodputFunction(PerfParams(0.01, 0.0005, 0.5, 0.05, 0.05, 0.01, 1.5), GRAD, 64)
MODELS: list[GoodputFunction | None] = [SCALES, SYNC_BOUND, None]


def cluster(*gpus: int) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"n{i}", count) for i, count in enumerate(gpus))


def job(
    job_id: int,
    *,
    submit: float = 0.0,
    remaining: float | None = 1000.0,
    model: GoodputFunction | None = SCALES,
    batch: int = 256,
    bounds: tuple[int, int] = (1, 1 << 20),
    max_gpus: int = 1 << 30,
    allocation: tuple[int, ...] = (),
) -> JobView:
    return JobView(
        id=job_id,
        submit_time=submit,
        batch_size=batch,
        init_batch_size=64,
        local_bsz_bounds=bounds,
        max_gpus=max_gpus,
        remaining_iterations=remaining,
        goodput=model,
        allocation=allocation,
    )


def state(nodes: tuple[NodeView, ...], *jobs: JobView) -> ClusterState:
    return ClusterState(nodes=nodes, jobs=tuple(sorted(jobs, key=lambda j: j.id)))


def counts(decision: Decision) -> dict[int, int]:
    return {key: sum(allocation) for key, allocation in decision.allocations.items()}


def test_the_registry_builds_afs_l_and_afs_p_each_under_its_name() -> None:
    policy = get_policy("afs", seed=3)
    assert isinstance(policy, AfsPolicy)
    assert (policy.name, policy.variant, policy.seed) == ("afs", "L", 3)
    assert AfsPolicy("P").name == AfsPPolicy.name == "afs-p"
    assert AfsPPolicy(seed=2).variant == "P"
    by_name = get_policy("afs-p", seed=5)
    assert isinstance(by_name, AfsPPolicy)
    assert (by_name.name, by_name.variant, by_name.seed) == ("afs-p", "P", 5)
    assert AfsPolicy("L").capabilities == Capabilities(
        preemption=True, remaining_work=True, remembers=True
    )
    assert AfsPolicy("P").capabilities == Capabilities(preemption=True, remembers=True)  # no oracle
    assert AfsPolicy("P").unit == DEFAULT_UNIT == 900.0


@pytest.mark.parametrize("kwargs", [{"variant": "Q"}, {"unit": 0.0}, {"unknown_step_time": -1.0}])
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        AfsPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("batch", "bounds", "per_node"),
    [(256, (1, 1 << 20), 4), (256, (1, 32), 4), (96, (8, 64), 2), (32, (1, 1 << 20), 8)],
)
def test_throughput_is_iterations_per_second_at_the_fixed_batch(
    batch: int, bounds: tuple[int, int], per_node: int
) -> None:
    view = state(cluster(per_node, per_node), job(1, batch=batch, bounds=bounds))
    table = AfsPolicy().throughput_table(view.jobs[0], view)
    assert table[0] == 0.0
    assert len(table) - 1 == min(2 * per_node, batch // bounds[0])
    for r in range(1, len(table)):
        step = fixed_batch_step_time(view.jobs[0], r, per_node)
        assert table[r] == pytest.approx(1.0 / step, rel=1e-12)


def test_a_job_without_a_model_is_overestimated_linearly_up_to_its_fair_share() -> None:
    view = state(cluster(4, 4), job(1, model=None), job(2), job(3))
    assert AfsPolicy(unknown_step_time=2.0).throughput_table(view.jobs[0], view) == (
        0.0,
        0.5,
        1.0,
    )


def test_max_gpus_bounds_the_table() -> None:
    view = state(cluster(8), job(1, max_gpus=3))
    assert len(AfsPolicy().throughput_table(view.jobs[0], view)) == 4


def test_afs_l_with_more_jobs_than_gpus_is_srtf_with_one_gpu_each() -> None:
    remaining = [500, 100, 600, 300, 200, 400]
    jobs = [job(i, remaining=r) for i, r in enumerate(remaining, start=1)]
    decision = AfsPolicy().decide(state(cluster(2, 2), *jobs), 0.0)
    assert counts(decision) == {2: 1, 5: 1, 4: 1, 6: 1}
    assert "waiting" in decision.notes[1]


def test_afs_l_shares_are_algorithm_1_on_the_jobs_tables() -> None:
    # 3-GPU nodes: no network packing, so the shares are placed as computed.
    policy = AfsPolicy()
    jobs = [job(1, remaining=300), job(2, remaining=5000, model=SYNC_BOUND), job(3, remaining=900)]
    view = state(cluster(3, 3), *jobs)
    afs_jobs = [
        AfsJob(j.id, policy.throughput_table(j, view), j.remaining_iterations or 0.0)
        for j in view.jobs
    ]
    expected = {key: n for key, n in afs_l(afs_jobs, 6).counts.items() if n}
    decision = policy.decide(view, 0.0)
    assert capacity_violations(view, decision) == []
    assert counts(decision) == expected
    assert len(set(expected.values())) > 1  # the example is not a trivial even split


def test_power_of_two_nodes_get_packed_shares() -> None:
    view = state(cluster(4, 4), *(job(i, remaining=100.0 * i) for i in range(1, 4)))
    shares = set(counts(AfsPolicy().decide(view, 0.0)).values())
    assert shares <= {1, 2, 4, 8}


def test_shares_change_only_at_churn_events() -> None:
    policy = AfsPolicy()
    view = state(cluster(4), job(1, remaining=100), job(2, remaining=900))
    first = policy.decide(view, 0.0)
    applied = dataclasses.replace(
        view,
        jobs=tuple(
            dataclasses.replace(j, allocation=first.allocations[j.id], remaining_iterations=50)
            for j in view.jobs
        ),
    )
    assert policy.decide(applied, 60.0) is first  # progress alone is no event
    arrived = dataclasses.replace(applied, jobs=(*applied.jobs, job(3, remaining=10)))
    assert policy.decide(arrived, 120.0) is not first
    refit = dataclasses.replace(
        arrived, jobs=(*arrived.jobs[:2], dataclasses.replace(arrived.jobs[2], goodput=SYNC_BOUND))
    )
    again = policy.decide(arrived, 180.0)
    assert policy.decide(refit, 240.0) is not again  # a new model re-runs the allocator


def simulate(
    policy: AfsPolicy,
    nodes: tuple[NodeView, ...],
    arrivals: Sequence[tuple[float, JobView]],
    until: float,
    tick: float = 60.0,
) -> list[tuple[float, Decision]]:
    """Apply each decision for one tick (jobs never finish); the decisions over time."""
    jobs: dict[int, JobView] = {}
    history = []
    now = 0.0
    while now <= until:
        for at, arriving in arrivals:
            if at == now:
                jobs[arriving.id] = arriving
        view = state(nodes, *jobs.values())
        decision = policy.decide(view, now)
        assert capacity_violations(view, decision) == []
        history.append((now, decision))
        for key, current in jobs.items():
            allocation = tuple(decision.allocations.get(key, (0,) * len(nodes)))
            ran = tick if sum(allocation) else 0.0
            jobs[key] = dataclasses.replace(
                current, allocation=allocation, run_time=current.run_time + ran
            )
        now += tick
    return history


def running(decision: Decision) -> set[int]:
    return {key for key, allocation in decision.allocations.items() if sum(allocation)}


def test_afs_p_shares_processor_time_in_units_when_jobs_outnumber_gpus() -> None:
    arrivals = [(0.0, job(1, submit=0)), (0.0, job(2, submit=1)), (0.0, job(3, submit=2))]
    arrivals.append((360.0, job(4, submit=360)))
    history = simulate(AfsPolicy("P", unit=300.0), cluster(2), arrivals, until=1500.0)
    by_time = {now: running(decision) for now, decision in history}
    # Counters (units executed) rank the jobs; ties go to the earlier submission.
    assert by_time[0.0] == by_time[240.0] == {1, 2}
    assert by_time[300.0] == {1, 3}  # counters 1, 1, 0: job 1 wins the tie and runs on
    # Job 4 arrives with counter 0 but may not preempt job 1 (counter 1) mid-unit.
    assert by_time[360.0] == by_time[540.0] == {1, 3}
    assert by_time[600.0] == {2, 4}  # counters 2, 1, 1, 0
    assert by_time[900.0] == {3, 4}  # counters 2, 2, 1, 1
    for _, decision in history:
        assert all(sum(allocation) == 1 for allocation in decision.allocations.values())


@pytest.mark.parametrize(("unit", "tick"), [(300.0, 60.0), (600.0, 60.0), (180.0, 30.0)])
def test_afs_p_evicts_a_job_after_exactly_one_unit(unit: float, tick: float) -> None:
    arrivals = [(0.0, job(i, submit=i)) for i in range(1, 6)]
    policy = AfsPolicy("P", unit=unit)
    history = simulate(policy, cluster(2, 1), arrivals, until=10 * unit, tick=tick)
    started: dict[int, float] = {}
    stretches = []
    for now, decision in history:
        for key in running(decision) - set(started):
            started[key] = now
        for key in set(started) - running(decision):
            stretches.append(now - started.pop(key))
    assert stretches
    assert all(length > 0 and length % unit == 0 for length in stretches)


@st.composite
def states(draw: st.DrawFn, max_jobs: int = 10) -> ClusterState:
    """A random cluster with jobs holding GPUs within capacity."""
    nodes = cluster(*draw(st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=1, max_size=4)))
    free = [node.gpus for node in nodes]
    jobs = []
    for key in range(draw(st.integers(1, max_jobs))):
        wanted = [draw(st.integers(0, 2)) for _ in nodes]
        allocation = tuple(min(w, f) for w, f in zip(wanted, free, strict=True))
        free = [f - a for f, a in zip(free, allocation, strict=True)]
        jobs.append(
            job(
                key,
                submit=draw(st.integers(0, 5)),
                remaining=draw(st.one_of(st.none(), st.floats(0, 1e5))),
                model=draw(st.sampled_from(MODELS)),
                batch=draw(st.sampled_from([0, 16, 64, 256])),
                max_gpus=draw(st.integers(1, 16)),
                allocation=allocation,
            )
        )
    return state(nodes, *jobs)


@settings(max_examples=60, deadline=None)
@given(states(), st.sampled_from(["L", "P"]), st.integers(0, 3))
def test_no_decision_exceeds_capacity(view: ClusterState, variant: str, seed: int) -> None:
    decision = AfsPolicy(variant, seed=seed).decide(view, 0.0)  # type: ignore[arg-type]
    assert capacity_violations(view, decision) == []
    assert all(sum(allocation) > 0 for allocation in decision.allocations.values())


@settings(max_examples=60, deadline=None)
@given(states())
def test_afs_p_gives_every_job_a_gpu_when_jobs_do_not_outnumber_gpus(view: ClusterState) -> None:
    decision = AfsPolicy("P").decide(view, 0.0)
    if len(view.jobs) <= view.total_gpus:
        assert set(decision.allocations) == {j.id for j in view.jobs}
    else:
        assert len(decision.allocations) == view.total_gpus
        assert all(sum(a) == 1 for a in decision.allocations.values())


@settings(max_examples=30, deadline=None)
@given(st.lists(states(max_jobs=6), min_size=1, max_size=4), st.sampled_from(["L", "P"]))
def test_decisions_are_a_function_of_the_seed_and_the_states(
    views: list[ClusterState], variant: str
) -> None:
    def replay(seed: int) -> list[Decision]:
        policy = AfsPolicy(variant, seed=seed, unit=120.0)  # type: ignore[arg-type]
        return [policy.decide(view, 60.0 * i) for i, view in enumerate(views)]

    assert replay(7) == replay(7)


def test_time_going_backwards_starts_a_new_run() -> None:
    policy = AfsPolicy("P", unit=300.0)
    arrivals = [(0.0, job(i, submit=i)) for i in range(1, 4)]
    first = [running(d) for _, d in simulate(policy, cluster(2), arrivals, until=900.0)]
    second = [running(d) for _, d in simulate(policy, cluster(2), arrivals, until=900.0)]
    assert first == second


def test_afs_p_never_reads_remaining_work() -> None:
    jobs = [job(i, remaining=100.0 * i, model=MODELS[i % 2]) for i in range(1, 5)]
    flipped = [dataclasses.replace(j, remaining_iterations=1e6 - j.id) for j in jobs]
    first = AfsPPolicy().decide(state(cluster(4, 4), *jobs), 0.0)
    second = AfsPPolicy().decide(state(cluster(4, 4), *flipped), 0.0)
    assert first.allocations == second.allocations


def test_afs_l_treats_unknown_remaining_work_as_the_longest() -> None:
    jobs = [job(1, remaining=None), job(2, remaining=5e5), job(3, remaining=None, submit=1)]
    assert set(AfsPolicy().decide(state(cluster(1)), 0.0).allocations) == set()
    assert set(AfsPolicy().decide(state(cluster(1), *jobs), 0.0).allocations) == {2}
