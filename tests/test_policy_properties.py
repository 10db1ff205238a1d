"""Invariants of the `fifo` policy over random clusters (hypothesis).

Whatever the view, applying the plan never over-commits a GPU, never puts a
job next to a whole-GPU or exclusive job, never places a job twice, accounts
for every pending job, and is a deterministic function of the view.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.policies.base import ClusterView, GpuState, JobRequest, Plan, RunningJob
from gpuq.policies.fifo import FifoBackfill

G = 1024**3
M = 1024**2


@dataclass
class Load:
    """What gpuq jobs hold on one GPU, checked independently of the policy."""

    shares: list[int] = field(default_factory=list)
    whole: int = 0

    @property
    def jobs(self) -> int:
        return len(self.shares) + self.whole


def usable(gpu: GpuState, margin: float) -> float:
    return gpu.memory_total * (1 - margin) - gpu.memory_foreign


@st.composite
def views(draw: st.DrawFn) -> ClusterView:
    """A random cluster whose running jobs respect capacity, with random pending jobs."""
    margin = draw(st.sampled_from([0.0, 0.05, 0.1]))
    tolerance = draw(st.sampled_from([0, 512 * M]))
    gpus = []
    for i in range(draw(st.integers(1, 8))):
        total = draw(st.sampled_from([16 * G, 24 * G, 40 * G, 80 * G]))
        foreign = draw(st.sampled_from([0, 0, 256 * M, 512 * M, G, total // 3]))
        gpus.append(GpuState(f"GPU-{i}", draw(st.sampled_from(["a", "b"])), total, foreign))

    loads = [Load() for _ in gpus]
    running: list[RunningJob] = []
    for job_id in range(100, 100 + draw(st.integers(0, 8))):
        count = draw(st.integers(1, 2))
        picked = draw(st.lists(st.integers(0, len(gpus) - 1), min_size=count, max_size=count))
        indices = sorted(set(picked))
        mem = draw(st.one_of(st.none(), st.integers(1, 30).map(lambda n: n * G)))
        exclusive = draw(st.booleans())
        if any(loads[i].whole for i in indices):
            continue
        if mem is None or exclusive:
            if any(loads[i].jobs for i in indices):
                continue
            for i in indices:
                loads[i].whole += 1
        else:
            if any(sum(loads[i].shares) + mem > usable(gpus[i], margin) for i in indices):
                continue
            for i in indices:
                loads[i].shares.append(mem)
        start = draw(st.floats(0, 1000))
        limit = draw(st.one_of(st.none(), st.floats(1, 2000)))
        uuids = tuple(gpus[i].uuid for i in indices)
        running.append(RunningJob(job_id, uuids, mem, exclusive, start, limit))

    pending = [
        JobRequest(
            job_id,
            draw(st.integers(0, 2)),
            draw(st.integers(0, 50).map(float)),
            draw(st.sampled_from([0, 1, 1, 1, 1, 2, 2, 3, 8])),
            draw(st.one_of(st.none(), st.integers(0, 50).map(lambda n: n * G // 2))),
            draw(st.booleans()),
            draw(st.one_of(st.none(), st.floats(1, 2000))),
        )
        for job_id in range(1, 1 + draw(st.integers(0, 30)))
    ]
    return ClusterView(tuple(gpus), tuple(pending), tuple(running), margin, tolerance)


def apply(view: ClusterView, plan: Plan) -> dict[str, Load]:
    """Every GPU's load after the plan, asserting each placement's own shape."""
    loads = {gpu.uuid: Load() for gpu in view.gpus}
    for held in view.running:
        for uuid in held.gpu_uuids:
            if held.gpu_mem is None or held.exclusive:
                loads[uuid].whole += 1
            else:
                loads[uuid].shares.append(held.gpu_mem)
    requests = {job.id: job for job in view.pending}
    for placement in plan.start:
        job = requests[placement.job_id]
        assert placement.gpu_mem == (job.gpu_mem if job.gpus > 0 else None)
        if job.gpus <= 0:
            assert placement.gpu_uuids == ()
            continue
        assert len(placement.gpu_uuids) == job.gpus
        assert len(set(placement.gpu_uuids)) == job.gpus
        for uuid in placement.gpu_uuids:
            if job.gpu_mem is None or job.exclusive:
                loads[uuid].whole += 1
            else:
                loads[uuid].shares.append(job.gpu_mem)
    return loads


@settings(max_examples=300, deadline=None)
@given(views(), st.floats(0, 3000))
def test_plans_respect_capacity_and_account_for_every_job(view: ClusterView, now: float) -> None:
    plan = FifoBackfill().decide(view, now)

    started = [placement.job_id for placement in plan.start]
    assert len(started) == len(set(started)), "a job was placed twice"
    assert set(started).isdisjoint(plan.waiting)
    assert set(started) | set(plan.waiting) == {job.id for job in view.pending}
    assert all(reason for reason in plan.waiting.values())

    loads = apply(view, plan)
    new_gpus = {uuid for placement in plan.start for uuid in placement.gpu_uuids}
    requests = {job.id: job for job in view.pending}
    for gpu in view.gpus:
        if gpu.uuid not in new_gpus:
            continue
        load = loads[gpu.uuid]
        if load.whole:
            assert load.jobs == 1, f"{gpu.uuid} is shared despite a whole/exclusive job"
        assert sum(load.shares) <= usable(gpu, view.memory_margin), f"{gpu.uuid} over-committed"
    for placement in plan.start:
        job = requests[placement.job_id]
        for uuid in placement.gpu_uuids:
            gpu = next(g for g in view.gpus if g.uuid == uuid)
            if job.gpu_mem is None:
                assert gpu.memory_foreign <= view.foreign_tolerance
            elif job.exclusive:
                assert job.gpu_mem <= usable(gpu, view.memory_margin)


@settings(max_examples=200, deadline=None)
@given(views(), st.floats(0, 3000))
def test_plans_are_deterministic(view: ClusterView, now: float) -> None:
    policy = FifoBackfill()
    plan = policy.decide(view, now)
    assert policy.decide(view, now) == plan
    assert FifoBackfill().decide(view, now) == plan
    shuffled = ClusterView(
        view.gpus,
        view.pending[::-1],
        view.running,
        view.memory_margin,
        view.foreign_tolerance,
    )
    assert FifoBackfill().decide(shuffled, now) == plan
