"""The simulator on a cluster of several GPU types (gpuq/sim/engine.py, gpuq/sim/jobs.py).

Jobs run on the measured tables of the type they hold, know their
single-GPU step times on every type from their first start, and show the
policy a model per type, measured or bootstrapped (gpuq/typemodels.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView
from gpuq.sim.apps import get_application
from gpuq.sim.cluster import load_cluster
from gpuq.sim.engine import Simulator
from gpuq.sim.workload import WorkloadJob

SIA = load_cluster("sia")  # 6x4 T4 (nodes 0-5), 3x8 RTX2080Ti (6-8), 2x8 A100 (9-10)


class Pinned:
    """Gives every job the allocation `place(job, state)` returns, and keeps what it saw."""

    name = "test-pinned"
    capabilities = Capabilities(adaptive_jobs=True)

    def __init__(self, place: Callable[[JobView, ClusterState], tuple[int, ...]]) -> None:
        self.place = place
        self.seen: list[tuple[float, tuple[JobView, ...]]] = []

    def decide(self, state: ClusterState, now: float) -> Decision:
        self.seen.append((now, state.jobs))
        return Decision(allocations={job.id: self.place(job, state) for job in state.jobs})


def pinned(allocation: tuple[int, ...]) -> Pinned:
    """A policy giving every job `allocation`."""
    return Pinned(lambda job, state: allocation)


def on(node: int, gpus: int, width: int = len(SIA.nodes)) -> tuple[int, ...]:
    allocation = [0] * width
    allocation[node] = gpus
    return tuple(allocation)


def bert(time: float = 0.0) -> WorkloadJob:
    return WorkloadJob("bert-0", time, "bert", 1, 12)


def test_a_job_on_a_faster_type_finishes_sooner() -> None:
    finish = {}
    for node, kind in [(0, "T4"), (9, "A100")]:
        simulator = Simulator(pinned(on(node, 1)), [bert()], cluster=SIA)
        (record,) = simulator.run().jobs
        assert simulator.jobs[0].gpu_type == kind
        finish[kind] = record.finish
    assert finish["A100"] < finish["T4"] / 1.5


def test_an_allocation_across_types_runs_on_the_type_holding_most_of_it() -> None:
    allocation = tuple(a + b for a, b in zip(on(0, 2), on(9, 1), strict=True))
    simulator = Simulator(Pinned(lambda j, s: allocation), [bert()], cluster=SIA)
    job = simulator.jobs[0]
    job.reallocate(allocation, simulator.node_types)
    assert (job.gpu_type, job.placement) == ("T4", (2,))  # the A100 GPU stays idle


def test_a_tie_between_types_goes_to_the_faster_type() -> None:
    allocation = tuple(a + b for a, b in zip(on(0, 1), on(9, 1), strict=True))
    simulator = Simulator(Pinned(lambda j, s: allocation), [bert()], cluster=SIA)
    job = simulator.jobs[0]
    job.reallocate(allocation, simulator.node_types)
    assert (job.gpu_type, job.placement) == ("A100", (1,))


def test_an_eight_gpu_node_of_its_type_is_one_measured_node() -> None:
    simulator = Simulator(Pinned(lambda j, s: on(6, 8)), [bert()], cluster=SIA)
    job = simulator.jobs[0]
    job.reallocate(on(6, 8), simulator.node_types)
    assert (job.gpu_type, job.placement) == ("RTX2080Ti", (8,))


def test_after_its_first_start_a_job_shows_a_model_for_every_type() -> None:
    policy = Pinned(lambda j, s: on(9, 2))
    Simulator(policy, [bert()], cluster=SIA).run()
    first_now, (first,) = policy.seen[0]
    assert first.per_type and all(m.goodput is None for m in first.per_type.values())
    assert first.gpu_type == ""
    # Once it has run on its 2 A100s (after the 120 s restart delay):
    later = next(jobs[0] for _, jobs in policy.seen if jobs[0].max_profiled_gpus == 2)
    assert later.gpu_type == "A100"
    assert set(later.per_type) == {"T4", "RTX2080Ti", "A100"}
    assert all(model.goodput is not None for model in later.per_type.values())
    # It ran on 2 A100s: measured there; the others are bootstrapped from it.
    assert {k for k, m in later.per_type.items() if m.measured} == {"A100"}
    a100 = later.per_type["A100"].goodput
    t4 = later.per_type["T4"].goodput
    assert a100 is not None and t4 is not None
    assert a100.throughput(1, 2, 8, 0) > t4.throughput(1, 2, 8, 0)
    # Bounds follow each type's memory, and the type-unaware model is there too.
    assert (
        later.per_type["A100"].local_bsz_bounds
        == get_application("bert", "A100", "sia").local_bsz_bounds
    )
    assert later.goodput is not None


def test_each_start_costs_the_applications_own_restart_delay() -> None:
    policy = Pinned(lambda j, s: on(9, 1))
    simulator = Simulator(policy, [bert()], cluster=SIA, restart_penalty=30.0)
    assert simulator.jobs[0].restart_penalty == 120.0  # Sia's bert
    simulator.run()
    _, (view,) = policy.seen[0]
    assert view.restart_penalty == 120.0


def test_a_one_type_cluster_shows_no_per_type_models() -> None:
    policy = Pinned(lambda j, s: (1,) + (0,) * (len(s.nodes) - 1))
    Simulator(policy, [WorkloadJob("bert-0", 0, "bert", 1, 12)]).run()
    _, (view,) = policy.seen[-1]
    assert view.per_type == {} and view.restart_penalty is None


@pytest.mark.parametrize("policy", ["sia", "pollux"])
def test_every_job_of_a_small_mixed_workload_finishes(policy: str) -> None:
    from gpuq.policies.registry import get_policy

    workload = [
        WorkloadJob("cifar10-0", 0, "cifar10", 2, 256),
        WorkloadJob("bert-1", 60, "bert", 1, 12),
        WorkloadJob("deepspeech2-2", 120, "deepspeech2", 4, 20),
    ]
    result = Simulator(get_policy(policy), workload, cluster=SIA).run()
    assert [record.finish > record.submit for record in result.jobs] == [True] * 3
