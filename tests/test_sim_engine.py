"""The simulator loop, sharing rules and metrics, driven by tiny test-local policies.

The rules are in the docstrings of gpuq/sim/engine.py, gpuq/sim/jobs.py and
gpuq/sim/metrics.py. Workloads here are a few short jobs (NCF, BERT, CIFAR-10
on few GPUs) so that the whole file runs in seconds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from gpuq.fairshare import Fairness, UserShare
from gpuq.goodput import GoodputFunction, adascale_gain, fit_perf_params
from gpuq.policies.interface import (
    Capabilities,
    ClusterState,
    Decision,
    JobView,
    capacity_violations,
)
from gpuq.sim.apps import BatchConfig, get_application
from gpuq.sim.engine import SimProgress, SimulationError, Simulator, sharing
from gpuq.sim.fair import SimLab
from gpuq.sim.jobs import FitMemo, SimJob
from gpuq.sim.metrics import JobRecord, SimResult
from gpuq.sim.workload import WorkloadJob


class Fifo:
    """Every job gets its requested GPUs, fewest nodes first, in arrival order."""

    name = "test-fifo"
    capabilities = Capabilities()

    def __init__(self) -> None:
        self.states: list[ClusterState] = []
        self.decisions: list[Decision] = []

    def decide(self, state: ClusterState, now: float) -> Decision:
        free = [node.gpus for node in state.nodes]
        allocations = {}
        for job in state.jobs:
            if job.running:
                allocations[job.id] = job.allocation
                free = [f - a for f, a in zip(free, job.allocation, strict=True)]
        for job in state.jobs:
            if job.running:
                continue
            need = job.gpus_requested
            if need > sum(free):
                break
            allocation = [0] * len(free)
            for i in sorted(range(len(free)), key=lambda i: -free[i]):
                take = min(free[i], need)
                allocation[i], free[i], need = take, free[i] - take, need - take
            allocations[job.id] = tuple(allocation)
        decision = Decision(allocations=allocations)
        self.states.append(state)
        self.decisions.append(decision)
        return decision


class AdaptiveFifo(Fifo):
    """The same, for jobs that pick their own batch size."""

    capabilities = Capabilities(adaptive_jobs=True)


class Scripted:
    """Allocations by time: `script(now, state)` returns the decision."""

    name = "test-scripted"
    capabilities = Capabilities()

    def __init__(self, script: Callable[[float, ClusterState], Decision]) -> None:
        self.script = script
        self.views: list[tuple[float, tuple[JobView, ...]]] = []

    def decide(self, state: ClusterState, now: float) -> Decision:
        self.views.append((now, state.jobs))
        return self.script(now, state)


def job(name: str, time: float, app: str, gpus: int, batch: int) -> WorkloadJob:
    return WorkloadJob(name, time, app, gpus, batch)


def solo_seconds(app_name: str, placement: tuple[int, ...], batch: int) -> float:
    """Training time at a fixed configuration, summed epoch by epoch from the tables."""
    app = get_application(app_name)
    replicas = sum(placement)
    config = app.fixed_batch_config(replicas, batch)
    step, sync = app.step_time(placement, config.atomic_bsz)
    step += config.accum_steps * (step - sync)
    total = replicas * config.atomic_bsz * (config.accum_steps + 1)
    seconds = 0.0
    for epoch in range(app.max_epochs):
        work = app.epoch_progress[epoch + 1] - app.epoch_progress[epoch]
        gain = adascale_gain(app.grad_params(epoch, total), app.init_batch_size, total)
        seconds += work * step / gain
    return seconds


SMALL = [
    job("cifar10-0", 0, "cifar10", 4, 1024),
    job("ncf-1", 30, "ncf", 1, 32768),
    job("bert-2", 45, "bert", 2, 48),
    job("cifar10-3", 100, "cifar10", 8, 2048),
    job("ncf-4", 400, "ncf", 1, 32768),
    job("bert-5", 500, "bert", 4, 96),
]


def test_fifo_finishes_every_job_within_capacity() -> None:
    policy = Fifo()
    result = Simulator(policy, SMALL, nodes=2, gpus_per_node=4).run()
    assert len(result.jobs) == len(SMALL)
    for record in result.jobs:
        assert record.submit <= record.start < record.finish
        assert record.gpu_time > 0
    for state, decision in zip(policy.states, policy.decisions, strict=True):
        assert capacity_violations(state, decision) == []
    assert 0 < result.gpu_utilization <= 1


@pytest.mark.parametrize(
    ("app", "gpus", "batch", "placement"),
    [("bert", 2, 48, (2,)), ("cifar10", 4, 1024, (4,)), ("ncf", 1, 32768, (1,))],
)
@pytest.mark.parametrize("penalty", [0.0, 30.0, 90.0])
def test_a_lone_job_finishes_when_its_tables_say(
    app: str, gpus: int, batch: int, placement: tuple[int, ...], penalty: float
) -> None:
    workload = [job("solo", 100.0, app, gpus, batch)]
    result = Simulator(Fifo(), workload, nodes=1, restart_penalty=penalty).run()
    (record,) = result.jobs
    assert record.start == 120.0  # the first tick after submission
    assert record.finish == pytest.approx(120.0 + penalty + solo_seconds(app, placement, batch))
    assert record.restarts == 0


@pytest.mark.parametrize(("penalty", "interval"), [(30.0, 60.0), (90.0, 60.0), (45.0, 20.0)])
def test_each_move_costs_exactly_the_restart_penalty(penalty: float, interval: float) -> None:
    workload = [job("bert", 0.0, "bert", 2, 48)]

    def move_once(now: float, state: ClusterState) -> Decision:
        return Decision(allocations={0: (2, 0) if now < 600 else (0, 2)})

    still = Simulator(
        Scripted(lambda now, s: Decision({0: (2, 0)})),
        workload,
        nodes=2,
        interval=interval,
        restart_penalty=penalty,
    ).run()
    moved = Simulator(
        Scripted(move_once), workload, nodes=2, interval=interval, restart_penalty=penalty
    ).run()
    assert moved.jobs[0].finish == pytest.approx(still.jobs[0].finish + penalty)
    assert (still.jobs[0].restarts, moved.jobs[0].restarts) == (0, 1)
    assert moved.reallocations == 1


def test_suspending_is_free_and_resuming_is_a_restart() -> None:
    workload = [job("bert", 0.0, "bert", 2, 48)]
    policy = Scripted(lambda now, s: Decision({} if 600 <= now < 1200 else {0: (2,)}))
    paused = Simulator(policy, workload, nodes=1, gpus_per_node=2).run()
    plain = Simulator(Fifo(), workload, nodes=1, gpus_per_node=2).run()
    assert paused.jobs[0].finish == pytest.approx(plain.jobs[0].finish + 600 + 30)
    assert paused.jobs[0].restarts == 1


def test_job_views_carry_request_history_and_oracle() -> None:
    workload = [job("cifar", 0.0, "cifar10", 2, 512)]
    policy = Scripted(lambda now, s: Decision({0: (2,)}))
    Simulator(policy, workload, nodes=1, gpus_per_node=4).run()
    first, second, later = policy.views[0][1][0], policy.views[1][1][0], policy.views[-1][1][0]
    assert (first.gpus_requested, first.batch_size, first.init_batch_size) == (2, 512, 128)
    assert (first.max_batch_size, first.local_bsz_bounds) == (4096, (32, 1024))
    assert not first.adaptive and first.max_gpus == 4  # capped at the cluster's 4 GPUs
    assert first.goodput is None and first.allocation == ()
    assert first.remaining_iterations == get_application("cifar10").total_iterations(512)
    assert isinstance(second.goodput, GoodputFunction)
    assert second.allocation == (2,) and second.max_profiled_gpus == 2
    assert second.attained_service == pytest.approx(2 * 60.0) and second.run_time == 60.0
    assert later.epoch > second.epoch
    assert later.remaining_iterations is not None and second.remaining_iterations is not None
    assert later.remaining_iterations < second.remaining_iterations


def test_adaptive_policies_get_adaptive_jobs_except_ncf() -> None:
    workload = [job("cifar", 0.0, "cifar10", 1, 128), job("ncf", 0.0, "ncf", 1, 32768)]
    policy = AdaptiveFifo()
    Simulator(policy, workload, nodes=1).run()
    cifar, ncf = policy.states[0].jobs
    assert cifar.adaptive and cifar.max_gpus == 4
    assert not ncf.adaptive and ncf.batch_size == 32768 and ncf.max_gpus == 1


def test_adaptive_jobs_grow_their_batch_within_bounds() -> None:
    app = get_application("cifar10")
    low, high = app.local_bsz_bounds
    workload = [job("cifar", 0.0, "cifar10", 4, 128)]
    configs = []

    class Watching(AdaptiveFifo):
        def decide(self, state: ClusterState, now: float) -> Decision:
            configs.append(simulator.jobs[0].config)  # what the job ran with last tick
            return super().decide(state, now)

    simulator = Simulator(Watching(), workload, nodes=1)
    simulator.run()
    batches = [config.total(4) for config in configs[1:] if config is not None]
    assert 128 < max(batches) <= app.max_batch_size
    assert all(low <= config.atomic_bsz <= high for config in configs[1:] if config)


def test_an_adaptive_job_starts_at_m0_and_keeps_its_batch_within_5_percent() -> None:
    app = get_application("cifar10")
    sim_job = SimJob(0, job("c", 0.0, "cifar10", 4, 128), app, True, 30.0)
    sim_job.reallocate((4,))
    assert sim_job.config == BatchConfig(32, 0)  # max(M0, min_local * K) without a model
    sim_job.advance(0.0, 60.0, 1.0, 1.0)  # runs, measures, fits its model
    assert sim_job.perf is not None
    goodput = sim_job.goodput()
    assert goodput is not None
    chosen = sim_job.config
    assert chosen is not None
    best, _, _ = goodput.optimize(1, 4, app.max_batch_size, app.local_bsz_bounds, True)
    now = goodput.evaluate(1, 4, chosen.atomic_bsz, chosen.accum_steps)
    assert now * 1.05 >= best  # kept only if the optimum is at most 5% better


def test_a_run_fits_each_set_of_configurations_in_the_first_order_it_saw() -> None:
    app = get_application("cifar10")
    one = app.profile_sample((1,), 32)
    two = app.profile_sample((2,), 64)
    three = app.profile_sample((4, 4), 128)
    ordered = {(1, 1, 32): one, (1, 2, 64): two, (2, 8, 128): three}
    reordered = {(2, 8, 128): three, (1, 2, 64): two, (1, 1, 32): one}
    run = FitMemo()
    assert run.fit(app, ordered) == fit_perf_params(*zip(one, two, three, strict=True))
    assert run.fit(app, reordered) == run.fit(app, ordered)  # shared within the run
    # Another run that sees the other order first fits that order: a run's
    # results never depend on the runs before it in the same process.
    assert FitMemo().fit(app, reordered) == fit_perf_params(*zip(three, two, one, strict=True))


def test_policy_batch_sizes_change_non_adaptive_jobs() -> None:
    workload = [job("cifar", 0.0, "cifar10", 2, 256)]
    policy = Scripted(lambda now, s: Decision({0: (2,)}, batch_sizes={0: 1024}))
    Simulator(policy, workload, nodes=1).run()
    assert policy.views[0][1][0].batch_size == 256
    assert policy.views[1][1][0].batch_size == 1024


@pytest.mark.parametrize(
    ("allocations", "packed", "interference", "expected"),
    [
        # Fits: everyone at full speed.
        ({1: (2, 0), 2: (2, 0)}, (), 0.0, {1: (1.0, 1.0), 2: (1.0, 1.0)}),
        # Over-subscribed node: round-robin at capacity / demand.
        ({1: (4, 0), 2: (4, 0)}, (), 0.0, {1: (0.5, 1.0), 2: (0.5, 1.0)}),
        # A job spanning nodes runs at its worst node's share.
        ({1: (4, 2), 2: (4, 0)}, (), 0.0, {1: (0.5, 1.0), 2: (0.5, 1.0)}),
        # Packed jobs count once in demand, then split the GPUs' time with overhead.
        ({1: (2, 0), 2: (2, 0)}, ((1, 2),), 0.0, {1: (0.5, 0.9), 2: (0.5, 0.9)}),
        (
            {1: (4, 0), 2: (4, 0), 3: (2, 0)},
            ((1, 2),),
            0.0,
            {1: (1 / 3, 0.9), 2: (1 / 3, 0.9), 3: (2 / 3, 1.0)},
        ),
        # Interference: two distributed jobs sharing a node both slow down.
        ({1: (2, 2), 2: (2, 2), 3: (0, 0)}, (), 0.25, {1: (1.0, 0.75), 2: (1.0, 0.75)}),
        ({1: (2, 2), 2: (2, 0)}, (), 0.25, {1: (1.0, 1.0), 2: (1.0, 1.0)}),
    ],
)
def test_sharing_rules(
    allocations: dict[int, tuple[int, ...]],
    packed: tuple[tuple[int, ...], ...],
    interference: float,
    expected: dict[int, tuple[float, float]],
) -> None:
    running = {k: v for k, v in allocations.items() if any(v)}
    factors = sharing((4, 4), running, packed, interference, packing_overhead=0.1)
    assert factors.keys() == expected.keys()
    for job_id, (share, speed) in expected.items():
        assert factors[job_id] == pytest.approx((share, speed))


def test_time_slicing_halves_the_rate_of_two_jobs_on_one_node() -> None:
    workload = [job("a", 0.0, "bert", 2, 48), job("b", 0.0, "bert", 2, 48)]
    both = Scripted(lambda now, s: Decision({j.id: (2,) for j in s.jobs}))
    result = Simulator(both, workload, nodes=1, gpus_per_node=2, restart_penalty=0).run()
    solo = solo_seconds("bert", (2,), 48)
    for record in result.jobs:
        assert record.jct == pytest.approx(2 * solo)
        assert record.gpu_time == pytest.approx(solo * 2)  # half the time on 2 GPUs
    assert result.gpu_utilization == pytest.approx(1.0)


def test_malformed_decisions_stop_the_simulation() -> None:
    workload = [job("a", 0.0, "ncf", 1, 32768)]
    for decision in (Decision({5: (1,)}), Decision({0: (1, 0, 0)}), Decision({0: (-1,)})):
        policy = Scripted(lambda now, s, d=decision: d)  # type: ignore[misc]
        with pytest.raises(SimulationError, match="test-scripted"):
            Simulator(policy, workload, nodes=1).run()


def test_a_policy_that_never_runs_a_job_is_reported() -> None:
    workload = [job("a", 0.0, "ncf", 1, 32768)]
    simulator = Simulator(Scripted(lambda now, s: Decision()), workload, stall_limit=3600)
    with pytest.raises(SimulationError, match="no job finished in 0.0416667 days"):
        simulator.run()


def test_jobs_held_back_by_the_per_user_cap_are_named_as_why_none_finished() -> None:
    """Not "check that every job's request fits the cluster": it does; the user's cap is lower."""
    workload = [WorkloadJob("wide", 0.0, "ncf", 4, 32768, user="alice")]
    simulator = Simulator(
        Scripted(lambda now, s: Decision()), workload, stall_limit=3600, lab=SimLab(max_gpus=2)
    )
    with pytest.raises(SimulationError) as stalled:
        simulator.run()
    assert stalled.value.message.endswith(
        "1 of them asks for more GPUs than one user may hold (--max-gpus-per-user 2), "
        "such as 'wide' (4 GPUs)"
    )
    assert stalled.value.hint == "raise --max-gpus-per-user to 4 or more, or leave it out"


def test_a_policy_that_restarts_jobs_forever_is_reported() -> None:
    workload = [job("a", 0.0, "bert", 1, 12)]
    flip = Scripted(lambda now, s: Decision({0: (1, 0) if int(now / 60) % 2 else (0, 1)}))
    simulator = Simulator(flip, workload, nodes=2, restart_penalty=90.0, stall_limit=3600)
    with pytest.raises(SimulationError, match="no job finished in 0.0416667 days"):
        simulator.run()


def test_idle_time_before_the_first_arrival_is_skipped() -> None:
    workload = [job("late", 10 * 3600 + 5, "ncf", 1, 32768)]
    policy = Fifo()
    result = Simulator(policy, workload, nodes=1).run()
    assert len(policy.states) == 2  # 30 s restart penalty and 33 s of training
    assert result.jobs[0].start == 10 * 3600 + 60


def test_requests_larger_than_the_cluster_are_capped() -> None:
    workload = [job("big", 0.0, "cifar10", 16, 4096)]
    policy = Fifo()
    Simulator(policy, workload, nodes=1, gpus_per_node=4).run()
    assert policy.states[0].jobs[0].gpus_requested == 4


def test_progress_is_reported_and_ends_complete() -> None:
    seen: list[SimProgress] = []
    Simulator(Fifo(), SMALL, nodes=2, progress_every=5).run(seen.append)
    assert len(seen) > 1
    assert seen[-1].finished == seen[-1].total == len(SMALL) and seen[-1].active == 0
    assert [p.now for p in seen] == sorted(p.now for p in seen)


def test_gradient_noise_is_seeded() -> None:
    def run(seed: int) -> float:
        return (
            Simulator(AdaptiveFifo(), SMALL[:3], nodes=2, grad_noise=0.5, seed=seed).run().avg_jct
        )

    assert run(1) == run(1)


def record(name: str, submit: float, finish: float, isolated: float = 100.0) -> JobRecord:
    return JobRecord(name, "bert", submit, submit, finish, 10.0, 0, isolated)


def test_summary_metrics() -> None:
    jobs = tuple(record(f"j{i}", 0.0, float(i)) for i in range(1, 101))
    result = SimResult("p", jobs, total_gpus=4, reallocations=3, decision_times=(0.1, 0.3))
    summary = result.summary()
    assert summary["avg_jct"] == pytest.approx(50.5)
    assert summary["median_jct"] == pytest.approx(50.5)
    assert summary["p99_jct"] == pytest.approx(99.01)
    assert summary["makespan"] == 100.0
    assert summary["gpu_utilization"] == pytest.approx(1000.0 / 400.0)
    assert summary["max_rho"] == pytest.approx(1.0) and summary["avg_rho"] == pytest.approx(0.505)
    assert summary["decision_time_mean"] == pytest.approx(0.2)
    assert summary["decision_time_max"] == 0.3
    assert summary["reallocations"] == 3
    encoded = json.loads(json.dumps(result.to_dict()))
    assert encoded["job_records"][0]["jct"] == 1.0 and encoded["avg_jct"] == 50.5


def test_a_lone_job_is_treated_about_fairly() -> None:
    workload = [job("solo", 0.0, "bert", 2, 48)]
    (record_,) = Simulator(Fifo(), workload, nodes=1, gpus_per_node=4).run().jobs
    assert record_.rho == pytest.approx(1.0)  # alone, it is its own equal share
    assert math.isclose(record_.isolated_jct, 30.0 + solo_seconds("bert", (2,), 48))


@pytest.mark.parametrize(("alice", "parts"), [(1.0, (0.5, 0.5)), (3.0, (0.75, 0.25))])
def test_in_lab_mode_a_packed_group_takes_turns_as_one_job_of_its_owner(
    alice: float, parts: tuple[float, float]
) -> None:
    # Alice's packed pair and bob's job over-subscribe two GPUs; the pair shares its part.
    allocations = {1: (2,), 2: (2,), 3: (2,)}
    owners = {1: "alice", 2: "alice", 3: "bob"}
    fair = Fairness({"alice": UserShare(share=alice), "bob": UserShare()})
    factors = sharing((2,), allocations, ((1, 2),), 0.0, 0.1, owners, fair)
    group, bob = parts
    assert factors == pytest.approx({1: (group / 2, 0.9), 2: (group / 2, 0.9), 3: (bob, 1.0)})
