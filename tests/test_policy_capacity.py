"""The elastic-policy registry, and capacity for every policy in it.

The registry builds policies by name, lists the known names when a name is
unknown, and imports policy modules only on demand.

For each policy whose module is present (`available_policies`), on
random clusters and jobs and over a few ticks in which the decision is
applied: no decision over-commits a node (`capacity_violations`), except in
policies that time-slice on purpose (`time_slicing = True`); allocations,
batch sizes and packed groups name only jobs of the state; the state is not
mutated; and two policies built with the same seed decide the same.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.errors import UsageError
from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies import registry
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import (
    Capabilities,
    ClusterState,
    Decision,
    JobView,
    NodeView,
    Policy,
    capacity_violations,
)
from gpuq.policies.registry import (
    POLICY_NAMES,
    available_policies,
    get_policy,
)

PERFS = (
    PerfParams(0.05, 0.002, 0.3, 0.02, 0.05, 0.005, 1.2),  # scales well
    PerfParams(0.02, 0.0005, 1.5, 0.3, 0.4, 0.05, 1.0),  # sync-bound
    PerfParams(0.2, 0.01, 0.1, 0.01, 0.02, 0.001, 3.0),  # compute-bound
)
GRADS = (GradParams(0.0, 1.0), GradParams(1.0, 1.0), GradParams(1.0, 50.0), GradParams(2.0, 0.1))
TICKS = 3
INTERVAL = 60.0


@st.composite
def jobs(draw: st.DrawFn, job_id: int, free: list[int]) -> JobView:
    """A pending or running job with consistent batch sizes; books its GPUs in `free`."""
    init = draw(st.sampled_from([32, 64, 128]))
    batch = init * draw(st.sampled_from([1, 2, 4]))
    low = draw(st.sampled_from([1, 8, init // 2]))
    high = draw(st.sampled_from([init, 2 * init, 4 * init]))
    model = draw(
        st.none()
        | st.builds(GoodputFunction, st.sampled_from(PERFS), st.sampled_from(GRADS), st.just(init))
    )
    allocation: tuple[int, ...] = ()
    if draw(st.booleans()):
        wanted = tuple(draw(st.integers(0, f)) for f in free)
        if sum(wanted) > 0:
            allocation = wanted
            for i, count in enumerate(wanted):
                free[i] -= count
    requested = draw(st.sampled_from([1, 1, 2, 4, 8]))
    service = draw(st.sampled_from([0.0, 600.0, 16 * 3600.0, 100 * 3600.0]))
    return JobView(
        id=job_id,
        submit_time=draw(st.integers(0, 3600)),
        gpus_requested=requested,
        batch_size=batch,
        init_batch_size=init,
        max_batch_size=batch * draw(st.sampled_from([1, 4, 16])),
        local_bsz_bounds=(low, high),
        adaptive=draw(st.booleans()),
        max_gpus=draw(st.sampled_from([1, 8, 64])),
        priority=draw(st.sampled_from([0, 0, 5])),
        application=draw(st.sampled_from(["cifar10", "bert", "ncf", ""])),
        allocation=allocation,
        attained_service=service if allocation else 0.0,
        run_time=service / max(requested, 1) if allocation else 0.0,
        num_restarts=draw(st.integers(0, 3)),
        max_profiled_gpus=max(sum(allocation), draw(st.integers(0, 4))),
        epoch=draw(st.integers(0, 20)),
        goodput=model,
        remaining_iterations=draw(st.none() | st.floats(0, 1e5)),
        gpu_utilization=draw(st.none() | st.floats(5, 100)),
        memory_peak=draw(st.none() | st.integers(1, 40).map(lambda g: g * 1024**3)),
    )


@st.composite
def cluster_states(draw: st.DrawFn) -> ClusterState:
    """A random cluster whose running jobs fit, with pending jobs of every kind."""
    nodes = tuple(
        NodeView(f"n{i}", draw(st.sampled_from([1, 2, 4, 8])))
        for i in range(draw(st.integers(1, 4)))
    )
    free = [node.gpus for node in nodes]
    count = draw(st.integers(0, 10))
    return ClusterState(
        nodes=nodes,
        jobs=tuple(draw(jobs(job_id, free)) for job_id in range(1, count + 1)),
        interval=INTERVAL,
        gpu_memory=draw(st.none() | st.just(40 * 1024**3)),
    )


def check(policy: Policy, state: ClusterState, decision: Decision) -> None:
    ids = {job.id for job in state.jobs}
    assert set(decision.allocations) <= ids
    assert set(decision.batch_sizes) <= ids
    assert all(size > 0 for size in decision.batch_sizes.values())
    assert {job_id for group in decision.packed for job_id in group} <= ids
    for allocation in decision.allocations.values():
        assert allocation == () or len(allocation) == len(state.nodes)
        assert all(count >= 0 for count in allocation)
    if not policy.capabilities.time_slicing:
        assert capacity_violations(state, decision) == []


def advance(state: ClusterState, decision: Decision, now: float) -> ClusterState:
    """The next tick's state: allocations applied, service and run time accrued."""
    jobs = []
    for job in state.jobs:
        allocation = tuple(decision.allocations.get(job.id, ()))
        gpus = sum(allocation)
        jobs.append(
            replace(
                job,
                allocation=allocation if gpus else (),
                attained_service=job.attained_service + gpus * INTERVAL,
                run_time=job.run_time + (INTERVAL if gpus else 0.0),
                num_restarts=job.num_restarts + (allocation != job.allocation and gpus > 0),
                max_profiled_gpus=max(job.max_profiled_gpus, gpus),
                remaining_iterations=(
                    None
                    if job.remaining_iterations is None
                    else max(job.remaining_iterations - 10.0 * gpus, 0.0)
                ),
            )
        )
    return replace(state, jobs=tuple(jobs))


@pytest.mark.parametrize("name", available_policies())
@given(state=cluster_states(), seed=st.integers(0, 3))
@settings(max_examples=25, deadline=None)
def test_no_policy_over_commits_and_each_is_deterministic(
    name: str, state: ClusterState, seed: int
) -> None:
    first, second = get_policy(name, seed), get_policy(name, seed)
    now = 7200.0
    for _ in range(TICKS):
        before = repr(state)
        decision = first.decide(state, now)
        assert repr(state) == before, "the policy mutated its state"
        check(first, state, decision)
        assert second.decide(state, now) == decision
        state = advance(state, decision, now)
        now += INTERVAL


# -- the registry ----------------------------------------------------------------------


def test_the_registry_knows_every_policy_of_the_issue() -> None:
    assert POLICY_NAMES == (
        "fifo", "srtf", "srsf", "tiresias", "optimus", "afs", "afs-p", "pollux", "sia", "gandiva",
        "ones", "gpuq",
    )  # fmt: skip
    assert {"fifo", "srtf", "srsf", "tiresias", "optimus"} <= set(available_policies())


def test_the_daemon_and_the_simulator_get_the_same_fifo() -> None:
    # One name, one class: the daemon's fifo (GPUs one by one, memory shares,
    # backfill) is the simulator's.
    assert type(get_policy("fifo")) is FifoBackfill
    assert registry.LIVE_POLICY_NAMES == ("fifo", "tiresias", "pollux", "gandiva", "gpuq")
    assert registry.check_live_policy("fifo") == "fifo"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "ones",
            "policy 'ones' runs only in the simulator so far (gpuq sim); "
            "the daemon runs: fifo, tiresias, pollux, gandiva, gpuq",
        ),
        ("ones:population=8", "runs only in the simulator so far"),
        (
            "lottery",
            "unknown policy 'lottery'; the daemon runs: fifo, tiresias, pollux, gandiva, gpuq",
        ),
        ("tiresias:quantum=3", "policy 'tiresias' has no option quantum"),
        ("gpuq:remaining_aware=true", "reads each job's remaining work, which the daemon"),
    ],
)
def test_a_policy_the_daemon_cannot_run_is_refused_with_the_ones_it_can(
    name: str, message: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(message)) as caught:
        registry.check_live_policy(name)
    assert caught.value.hint is not None


def test_a_live_policy_may_carry_options() -> None:
    spec = "tiresias:thresholds_gpu_hours=0.5"
    assert registry.check_live_policy(spec) == spec


@pytest.mark.parametrize("name", ["srtf", "srsf", "tiresias", "optimus"])
def test_policies_are_built_by_name_with_their_seed(name: str) -> None:
    policy = get_policy(name, seed=7)
    assert policy.name == name
    assert getattr(policy, "seed", None) == 7
    assert policy.capabilities.adaptive_jobs is False


def test_every_policy_declares_what_it_needs_from_its_caller() -> None:
    declared = {name: get_policy(name).capabilities for name in POLICY_NAMES}
    assert all(isinstance(c, Capabilities) for c in declared.values())
    assert {n for n, c in declared.items() if c.adaptive_jobs} == {"pollux", "sia", "gpuq"}
    assert {n for n, c in declared.items() if c.time_slicing} == {"gandiva", "gpuq"}
    assert {n for n, c in declared.items() if c.packing} == {"gandiva", "gpuq"}
    assert get_policy("gpuq:packing=false").capabilities.packing is False
    assert {n for n, c in declared.items() if not c.preemption} == set()  # fifo moves jobs
    assert get_policy("fifo:moves=false").capabilities.preemption is False
    assert {n for n, c in declared.items() if c.remembers} == {
        "afs", "afs-p", "pollux", "gandiva", "ones", "gpuq",
    }  # fmt: skip
    assert {n for n, c in declared.items() if c.remaining_work} == {
        "srtf", "srsf", "optimus", "afs", "ones",
    }  # fmt: skip
    # gpuq reads remaining work only with the option that charges moves over it.
    assert get_policy("gpuq:remaining_aware=true").capabilities.remaining_work


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match="unknown policy 'lottery'; known: fifo, srtf, srsf"):
        get_policy("lottery")


def test_options_after_the_name_reach_the_constructor() -> None:
    gpuq = get_policy("gpuq:starts=free:remaining_aware=true", seed=4)
    assert (gpuq.starts, gpuq.remaining_aware, gpuq.seed) == ("free", True, 4)  # type: ignore[attr-defined]
    assert get_policy("pollux:p=-0.5").p == -0.5  # type: ignore[attr-defined]
    assert registry.split_policy_spec("pollux:generations=20") == ("pollux", {"generations": 20})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpuq:fast=true", "policy 'gpuq' has no option fast"),
        ("fifo:seed=3", "bad policy option 'seed=3'"),
        ("gpuq:starts", "bad policy option 'starts'"),
        ("gpuq:starts=sometimes", "starts must be one of idle, free, charged"),
        ("pollux:p=inf", "p must be a finite number"),
        ("gpuq:quantum=nan", "quantum must be a finite number"),
        ("gandiva:quantum=inf", "quantum must be a finite number"),
        ("fifo:move_after=1e999", "move_after must be a finite number"),
        ("tiresias:thresholds_gpu_hours=-inf", "thresholds_gpu_hours must be a finite number"),
        ("gpuq:quantum=abc", "quantum must be a number, got 'abc'"),
        ("gpuq:quantum=true", "quantum must be a number, got 'true'"),
        ("gpuq:moves=3", "moves must be true or false, got '3'"),
        ("gpuq:population=2.5", "population must be a whole number, got '2.5'"),
        ("gpuq:restart_penalty=x", "restart_penalty must be a number, got 'x'"),
        ("tiresias:thresholds_gpu_hours=x", "thresholds_gpu_hours must be a number, got 'x'"),
        ("afs:variant=Q", "variant must be 'L' or 'P', got 'Q'"),
    ],
)
def test_bad_policy_options_are_usage_errors(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        get_policy(spec)


def test_a_mistyped_option_is_refused_with_its_default_in_the_hint() -> None:
    with pytest.raises(UsageError) as refused:
        get_policy("gpuq:quantum=abc")
    assert refused.value.hint == "its default: gpuq:quantum=60.0"


def test_option_values_are_read_as_the_constructor_takes_them() -> None:
    assert get_policy("fifo:move_after=30").move_after == 30  # type: ignore[attr-defined]
    assert get_policy("pollux:generations=20").generations == 20  # type: ignore[attr-defined]
    gandiva = get_policy("gandiva:grow_shrink_jobs=bert,gpt")
    assert gandiva._opts_in(_job_named("bert")) and not gandiva._opts_in(_job_named("b"))  # type: ignore[attr-defined]


def _job_named(application: str) -> object:
    return type("Job", (), {"application": application})()


def test_a_policy_whose_module_is_missing_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        registry._POLICIES, "ghost", registry.Entry("gpuq.policies.no_such_module", "Ghost")
    )
    assert not registry.policy_available("ghost")
    with pytest.raises(UsageError, match="not available in this build"):
        get_policy("ghost")


def test_importing_the_registry_imports_no_policy_module_and_no_numpy() -> None:
    probe = (
        "import sys, gpuq.policies.registry as r; r.available_policies(); "
        "print(sorted(m for m in sys.modules if m.startswith(('numpy', 'scipy', "
        "'gpuq.policies.pollux.policy', 'gpuq.policies.tiresias', 'gpuq.goodput'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
