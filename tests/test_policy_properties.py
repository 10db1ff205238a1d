"""Invariants of the `fifo` policy over random clusters (hypothesis).

Whatever the cluster, applying the decision (bound to GPUs as the daemon
binds it) never over-commits a GPU, never puts a job next to a whole-GPU or
exclusive job, never places a job twice, moves a running job only as
`gpuq.policies.consolidate` allows (a settled, preemptible one-GPU job, on
its node, with its shape, for a job placed on the GPUs it frees), places a
job only on the nodes its placement constraint allows, accounts for every
pending job, and is a deterministic function of the state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.daemon.scheduler.binding import RELEASE_WAIT, Placement, placements
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView

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


def usable(gpu: GpuView, margin: float) -> float:
    return gpu.memory_total * (1 - margin) - gpu.memory_foreign


@st.composite
def states(draw: st.DrawFn) -> ClusterState:
    """A random cluster whose running jobs respect capacity, with random pending jobs."""
    margin = draw(st.sampled_from([0.0, 0.05, 0.1]))
    tolerance = draw(st.sampled_from([0, 512 * M]))
    gpus = []
    for i in range(draw(st.integers(1, 8))):
        total = draw(st.sampled_from([16 * G, 24 * G, 40 * G, 80 * G]))
        foreign = draw(st.sampled_from([0, 0, 256 * M, 512 * M, G, total // 3]))
        node = draw(st.sampled_from(["a", "b"]))
        group = draw(st.sampled_from(["", "s0", "s1"]))
        gpus.append(GpuView(f"GPU-{i}", node, total, foreign, link_group=group))

    loads = [Load() for _ in gpus]
    running: list[JobView] = []
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
        running.append(
            JobView(
                job_id,
                start,
                gpus_requested=len(uuids),
                gpu_mem=mem,
                exclusive=exclusive,
                time_limit=limit,
                gpu_uuids=uuids,
                start_time=start,
                preemptible=draw(st.booleans()),
                moved_at=draw(st.one_of(st.none(), st.floats(0, 1000))),
            )
        )

    pending = [
        JobView(
            job_id,
            draw(st.integers(0, 50).map(float)),
            priority=draw(st.integers(0, 2)),
            gpus_requested=draw(st.sampled_from([0, 1, 1, 1, 1, 2, 2, 3, 8])),
            gpu_mem=draw(st.one_of(st.none(), st.integers(0, 50).map(lambda n: n * G // 2))),
            exclusive=draw(st.booleans()),
            time_limit=draw(st.one_of(st.none(), st.floats(1, 2000))),
            nodes=draw(st.sampled_from([None, None, None, frozenset("a"), frozenset("b")])),
        )
        for job_id in range(1, 1 + draw(st.integers(0, 30)))
    ]
    nodes = {gpu.node: 0 for gpu in gpus}
    for gpu in gpus:
        nodes[gpu.node] += 1
    return ClusterState(
        nodes=tuple(NodeView(name, count) for name, count in nodes.items()),
        jobs=tuple(sorted([*pending, *running], key=lambda job: job.id)),
        gpus=tuple(gpus),
        memory_margin=margin,
        foreign_tolerance=tolerance,
    )


SETTLE = 60.0


def decide(state: ClusterState, now: float) -> tuple[list[Placement], dict[int, str], Decision]:
    """What the daemon would start, why each other pending job waits, and the decision."""
    decision = FifoBackfill(move_after=SETTLE).decide(state, now)
    node_of = {gpu.uuid: gpu.node for gpu in state.gpus}
    moved = {
        held.id
        for held in state.jobs
        if held.gpu_uuids and decision.bindings[held.id] != held.gpu_uuids
    }
    freed: set[str] = set()
    for held in state.jobs:
        if held.id not in moved:
            continue
        target = decision.bindings[held.id]
        assert held.preemptible and len(held.gpu_uuids) == len(target) == 1
        assert now - max(held.start_time, held.moved_at or 0.0) >= SETTLE
        assert node_of[target[0]] == node_of[held.gpu_uuids[0]], "a move left its node"
        assert decision.notes[held.id].startswith("frees GPU")
        freed.update(held.gpu_uuids)
    starts, waiting = placements(state, decision)
    if moved:  # never for nothing: a waiting job is placed on a GPU a move frees
        pending = {job.id for job in state.jobs if not job.gpu_uuids}
        placed = [
            job_id for job_id in pending if freed.intersection(decision.bindings.get(job_id, ()))
        ]
        assert placed and all(waiting[job_id] == RELEASE_WAIT for job_id in placed)
    return starts, waiting, decision


def apply(state: ClusterState, starts: list[Placement], decision: Decision) -> dict[str, Load]:
    """Every GPU's load after the moves and starts, asserting each placement's own shape."""
    loads = {gpu.uuid: Load() for gpu in state.gpus}
    for held in state.jobs:
        for uuid in decision.bindings.get(held.id, held.gpu_uuids) if held.gpu_uuids else ():
            if held.gpu_mem is None or held.exclusive:
                loads[uuid].whole += 1
            else:
                loads[uuid].shares.append(held.gpu_mem)
    requests = {job.id: job for job in state.jobs}
    for placement in starts:
        job = requests[placement.job_id]
        assert placement.gpu_mem == job.gpu_mem
        assert job.gpus_requested > 0, "a job asking for no GPU is the caller's to start"
        assert len(placement.gpu_uuids) == job.gpus_requested
        assert len(set(placement.gpu_uuids)) == job.gpus_requested
        for uuid in placement.gpu_uuids:
            if job.gpu_mem is None or job.exclusive:
                loads[uuid].whole += 1
            else:
                loads[uuid].shares.append(job.gpu_mem)
    return loads


@st.composite
def scattered(draw: st.DrawFn) -> ClusterState:
    """Equal GPUs in two link groups, small shares scattered over them, and jobs waiting.

    The states where moves matter: most share jobs can be moved (settled
    and preemptible), single-GPU whole jobs sit in link groups, and the
    queue holds whole-GPU, multi-GPU and share jobs.
    """
    count = draw(st.integers(2, 8))
    gpus = [GpuView(f"GPU-{i}", "a", 16 * G, link_group=f"s{i * 2 // count}") for i in range(count)]
    running: list[JobView] = []
    job_id = 100
    for gpu in gpus:
        kind = draw(st.sampled_from(["free", "free", "shares", "shares", "whole"]))
        sizes = [
            draw(st.sampled_from([2 * G, 3 * G, 5 * G])) for _ in range(draw(st.integers(1, 2)))
        ]
        for size in sizes if kind == "shares" else [None] if kind == "whole" else []:
            job_id += 1
            running.append(
                JobView(
                    job_id,
                    0.0,
                    gpu_mem=size,
                    gpu_uuids=(gpu.uuid,),
                    start_time=draw(st.sampled_from([0.0, 90.0])),
                    preemptible=draw(st.sampled_from([True, True, True, False])),
                )
            )
    pending = [
        JobView(
            job_id,
            float(job_id),
            gpus_requested=draw(st.integers(1, 4)),
            gpu_mem=draw(st.sampled_from([None, None, 4 * G, 12 * G])),
        )
        for job_id in range(1, 1 + draw(st.integers(1, 4)))
    ]
    return ClusterState(
        nodes=(NodeView("a", count),),
        jobs=tuple(sorted([*pending, *running], key=lambda job: job.id)),
        gpus=tuple(gpus),
        memory_margin=0.0,
    )


@settings(max_examples=300, deadline=None)
@given(st.one_of(states(), scattered()), st.floats(0, 3000))
def test_decisions_respect_capacity_and_account_for_every_job(
    state: ClusterState, now: float
) -> None:
    starts, waiting, decision = decide(state, now)

    started = [placement.job_id for placement in starts]
    assert len(started) == len(set(started)), "a job was placed twice"
    assert set(started).isdisjoint(waiting)
    assert set(started) | set(waiting) == {job.id for job in state.jobs if not job.gpu_uuids}
    assert all(reason for reason in waiting.values())
    node_of = {gpu.uuid: gpu.node for gpu in state.gpus}
    for job in state.jobs:
        if job.nodes is not None and not job.gpu_uuids:
            placed = {node_of[uuid] for uuid in decision.bindings.get(job.id, ())}
            assert placed <= job.nodes, f"job {job.id} placed outside its nodes"
    assert not any(reason.startswith("not started") for reason in waiting.values())

    loads = apply(state, starts, decision)
    new_gpus = {uuid for placement in starts for uuid in placement.gpu_uuids}
    new_gpus.update(
        uuid
        for held in state.jobs
        if held.gpu_uuids
        for uuid in decision.bindings[held.id]
        if uuid not in held.gpu_uuids
    )
    requests = {job.id: job for job in state.jobs}
    for gpu in state.gpus:
        if gpu.uuid not in new_gpus:
            continue
        load = loads[gpu.uuid]
        if load.whole:
            assert load.jobs == 1, f"{gpu.uuid} is shared despite a whole/exclusive job"
        assert sum(load.shares) <= usable(gpu, state.memory_margin), f"{gpu.uuid} over-committed"
    for placement in starts:
        job = requests[placement.job_id]
        for uuid in placement.gpu_uuids:
            gpu = next(g for g in state.gpus if g.uuid == uuid)
            if job.gpu_mem is None:
                assert gpu.memory_foreign <= state.foreign_tolerance
            elif job.exclusive:
                assert job.gpu_mem <= usable(gpu, state.memory_margin)


@settings(max_examples=200, deadline=None)
@given(states(), st.floats(0, 3000))
def test_decisions_are_deterministic(state: ClusterState, now: float) -> None:
    policy = FifoBackfill()
    decision = policy.decide(state, now)
    assert policy.decide(state, now) == decision
    assert FifoBackfill().decide(state, now) == decision
    shuffled = ClusterState(
        state.nodes,
        state.jobs[::-1],
        gpus=state.gpus,
        memory_margin=state.memory_margin,
        foreign_tolerance=state.foreign_tolerance,
    )
    assert FifoBackfill().decide(shuffled, now) == decision
