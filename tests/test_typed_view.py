"""The daemon's view of a job on each GPU type, from its runner's fits (`scheduler.typed`).

A runner reports the model it fitted where it runs; the daemon keeps the
newest per type, and on a view of several types gives each reporting job
its model on every type: its own fit where it ran, elsewhere that fit
scaled by the types' prior speeds. A trace job on Sia's tables runs at its
GPU type's speed and reports that type's model.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpuq.daemon.scheduler.typed import TypeFits, record, typed_view
from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.gputypes import RELATIVE_SPEED, relative_speed
from gpuq.policies.interface import ClusterState, JobView, NodeView
from gpuq.replay.tracejob import Trace, table_type
from gpuq.sim.apps import GPU_TYPES, get_application

PERF = (0.1, 0.01, 0.0, 0.0, 0.05, 0.001, 1.2)
MIXED = (NodeView("vm/T4", 1, "T4"), NodeView("vm/A100", 1, "A100"))


def sample(**fields: object) -> dict[str, object]:
    return {"perf_params": list(PERF), "gpu_type": "T4", "replicas": 1, "gpus": 1, **fields}


def reporting_job(job_id: int = 1, allocation: tuple[int, ...] = (1, 0)) -> JobView:
    goodput = GoodputFunction(PerfParams(*PERF), GradParams(1.0, 0.5), 128)
    return JobView(
        id=job_id,
        submit_time=0.0,
        adaptive=True,
        goodput=goodput,
        allocation=allocation,
        local_bsz_bounds=(16, 512),
    )


def test_a_sample_s_model_is_kept_as_its_type_s_newest_fit() -> None:
    fits: TypeFits = {}
    assert record(fits, sample())
    assert not record(fits, sample()), "the same model again is not news"
    assert record(fits, sample(perf_params=[2 * v for v in PERF], replicas=2))
    assert fits["T4"] == (tuple(2 * v for v in PERF), 2)
    record(fits, sample(replicas=1))
    assert fits["T4"][1] == 2, "the most GPUs measured there stays"


@pytest.mark.parametrize(
    "fields",
    [{"perf_params": None}, {"perf_params": [1.0, 2.0]}, {"gpu_type": ""}, {"gpu_type": "A100,T4"}],
)
def test_a_sample_that_says_nothing_of_one_type_is_ignored(fields: dict[str, object]) -> None:
    fits: TypeFits = {}
    assert not record(fits, sample(**fields))
    assert fits == {}


def test_on_one_type_the_view_is_left_as_it_is() -> None:
    cluster = ClusterState(nodes=(NodeView("vm", 2, "T4"),), jobs=(reporting_job(),))
    assert typed_view(cluster, {1: {"T4": (PERF, 1)}}) is cluster


def test_a_job_measured_on_a_t4_is_estimated_faster_on_an_a100_by_the_prior() -> None:
    cluster = ClusterState(nodes=MIXED, jobs=(reporting_job(),))
    [job] = typed_view(cluster, {1: {"T4": (PERF, 1)}}).jobs
    assert job.gpu_type == "T4"
    t4, a100 = job.per_type["T4"], job.per_type["A100"]
    assert (t4.measured, a100.measured) == (True, False)
    assert t4.goodput is not None and a100.goodput is not None
    speedup = RELATIVE_SPEED["A100"] / RELATIVE_SPEED["T4"]
    assert a100.goodput.perf.alpha_c == pytest.approx(PERF[0] / speedup)
    assert a100.goodput.grad == t4.goodput.grad == GradParams(1.0, 0.5)
    assert a100.local_bsz_bounds == (16, 512)


def test_a_job_holding_the_a100_runs_there_and_its_own_fit_there_wins() -> None:
    faster = tuple(v / 2 for v in PERF[:6]) + (PERF[6],)
    cluster = ClusterState(nodes=MIXED, jobs=(reporting_job(allocation=(0, 1)),))
    [job] = typed_view(cluster, {1: {"T4": (PERF, 1), "A100": (faster, 1)}}).jobs
    assert job.gpu_type == "A100"
    model = job.per_type["A100"]
    assert model.measured and model.goodput is not None
    assert model.goodput.perf == PerfParams(*faster)


def test_jobs_without_a_model_or_a_fit_are_left_alone() -> None:
    silent = dataclasses.replace(reporting_job(2), goodput=None)
    cluster = ClusterState(nodes=MIXED, jobs=(reporting_job(1), silent))
    first, second = typed_view(cluster, {2: {"T4": (PERF, 1)}}).jobs
    assert (first.per_type, second.per_type) == ({}, {})


def test_a_type_without_a_prior_speed_gets_only_what_was_measured_there() -> None:
    nodes = (NodeView("vm/T4", 1, "T4"), NodeView("vm/L4", 1, "L4"))
    assert relative_speed("L4") is None and relative_speed("a100") == RELATIVE_SPEED["A100"]
    [job] = typed_view(
        ClusterState(nodes=nodes, jobs=(reporting_job(),)), {1: {"T4": (PERF, 1)}}
    ).jobs
    assert set(job.per_type) == {"T4"}


def test_a_trace_job_runs_at_its_gpu_type_s_speed_and_reports_that_type_s_model() -> None:
    apps = {kind: get_application("cifar10", kind, "sia") for kind in GPU_TYPES["sia"]}
    rates = {}
    for kind in ("T4", "A100"):
        trace = Trace(apps[kind], 128, adaptive=True, restart_penalty=0.0, apps=apps)
        trace.start(1, kind)
        trace.advance(600.0)
        rates[kind] = trace.job.progress
        assert trace.job.gpu_type == kind
        assert trace.job.goodput_on(kind) is not None
    assert rates["A100"] > 2 * rates["T4"]  # cifar10: 6.9 times the samples per second


def test_a_trace_restarted_on_another_type_keeps_what_it_measured_on_the_first() -> None:
    apps = {kind: get_application("cifar10", kind, "sia") for kind in GPU_TYPES["sia"]}
    first = Trace(apps["T4"], 128, adaptive=True, restart_penalty=0.0, apps=apps)
    first.start(1, "T4")
    first.advance(600.0)
    second = Trace(apps["T4"], 128, adaptive=True, restart_penalty=0.0, apps=apps)
    second.load(first.state())
    second.start(1, "A100")
    assert second.job.gpu_type == "A100"
    assert second.job.profiles["T4"] == first.job.profiles["T4"]
    assert second.job.progress == first.job.progress


def test_the_tables_type_of_a_gpu_is_found_in_any_case_and_defaults_to_the_first() -> None:
    apps = {kind: get_application("cifar10", kind, "sia") for kind in GPU_TYPES["sia"]}
    assert table_type("a100", apps) == "A100"
    assert table_type("L4", apps) == "T4"
