"""The scheduler pass: resolve readiness, ask the policy, launch.

One pass runs explicit, ordered steps on the event loop: settle pending jobs
whose dependencies can never be met, decide which pending jobs are ready
(holds, begin times, dependencies, array limits), build the `ClusterState`,
call the policy, bind its decision to GPUs (`gpuq.daemon.binding`), and
start what it placed. Readiness and state building are
pure functions, so they are unit-tested without a daemon.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuq.daemon import lifecycle
from gpuq.daemon.binding import Placement, placements
from gpuq.daemon.state import DaemonState, GpuSnapshot
from gpuq.models import Job, JobState
from gpuq.policies.interface import ClusterState, GpuView, JobView, NodeView


@dataclass(frozen=True, slots=True)
class Readiness:
    """Which pending jobs the policy may consider, and why the others wait."""

    ready: list[Job]
    waiting: dict[int, str]
    never: dict[int, str]
    next_begin: float | None


def readiness(
    pending: list[Job],
    lookup: Callable[[int], JobState | None],
    running_per_array: Mapping[int, int],
    now: float,
) -> Readiness:
    """Split queued jobs into ready and waiting (with reasons); pure.

    `never` holds jobs whose dependencies can never be satisfied: the caller
    cancels them with the reason given.
    """
    ready: list[Job] = []
    waiting: dict[int, str] = {}
    never: dict[int, str] = {}
    next_begin: float | None = None
    started_now: dict[int, int] = {}
    for job in pending:
        spec = job.spec
        if spec.begin is not None and spec.begin > now:
            waiting[job.id] = (
                f"begins at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(spec.begin))}"
            )
            next_begin = spec.begin if next_begin is None else min(next_begin, spec.begin)
            continue
        if job.retry_at is not None and job.retry_at > now:
            # Its own reason says when and which attempt ("...; retrying in 4s (attempt 3 of 5)").
            next_begin = job.retry_at if next_begin is None else min(next_begin, job.retry_at)
            continue
        blocked = ""
        for dep in spec.after:
            dep_state = lookup(dep.job_id)
            verdict = None if dep_state is None else dep.satisfied_by(dep_state)
            if verdict is False:
                assert dep_state is not None
                never[job.id] = (
                    f"dependency {dep} can never be satisfied: job {dep.job_id} {dep_state.value}"
                )
                break
            if verdict is None:
                blocked = f"waiting for job {dep.job_id} ({dep.kind.value})"
                break
        if job.id in never:
            continue
        if blocked:
            waiting[job.id] = blocked
            continue
        if spec.array_parallel is not None and job.array_id is not None:
            busy = running_per_array.get(job.array_id, 0) + started_now.get(job.array_id, 0)
            if busy >= spec.array_parallel:
                waiting[job.id] = f"array limit: {spec.array_parallel} tasks at a time"
                continue
            started_now[job.array_id] = started_now.get(job.array_id, 0) + 1
        ready.append(job)
    return Readiness(ready, waiting, never, next_begin)


def build_state(
    ready: list[Job],
    active: list[Job],
    gpus: GpuSnapshot,
    memory_margin: float,
    foreign_tolerance: int,
    learned_memory: Callable[[Job], int | None],
) -> ClusterState:
    """The policy's state of this server: its GPUs, and its ready and running GPU jobs."""
    nodes: dict[str, int] = {}
    for device in gpus.devices:
        nodes[device.node] = nodes.get(device.node, 0) + 1
    node_of = {uuid: list(nodes).index(g.node) for g in gpus.devices for uuid in (g.uuid,)}

    def allocation(uuids: tuple[str, ...]) -> tuple[int, ...]:
        counts = [0] * len(nodes)
        for uuid in uuids:
            if uuid in node_of:
                counts[node_of[uuid]] += 1
        return tuple(counts)

    views: list[JobView] = []
    for job in ready:
        spec = job.spec
        gpu_mem = spec.gpu_mem
        if spec.gpu_mem_auto:
            gpu_mem = learned_memory(job)  # None: no history, so it profiles on a whole GPU
        views.append(
            JobView(
                id=job.id,
                submit_time=job.submit_time,
                gpus_requested=spec.gpus,
                max_gpus=spec.gpus,
                priority=spec.priority,
                name=spec.name,
                gpu_mem=gpu_mem,
                exclusive=spec.exclusive,
                time_limit=spec.time_limit,
            )
        )
    for job in active:
        if job.state.is_active and job.gpu_uuids:
            views.append(
                JobView(
                    id=job.id,
                    submit_time=job.submit_time,
                    gpus_requested=job.spec.gpus,
                    max_gpus=job.spec.gpus,
                    priority=job.spec.priority,
                    name=job.spec.name,
                    allocation=allocation(job.gpu_uuids),
                    gpu_mem=job.gpu_mem_reserved,
                    exclusive=job.spec.exclusive,
                    time_limit=job.spec.time_limit,
                    gpu_uuids=job.gpu_uuids,
                    start_time=job.start_time or job.submit_time,
                )
            )
    views.sort(key=lambda view: view.id)
    return ClusterState(
        nodes=tuple(NodeView(name, count) for name, count in nodes.items()),
        jobs=tuple(views),
        gpus=tuple(
            GpuView(
                uuid=g.uuid,
                node=g.node,
                memory_total=g.memory_total,
                memory_foreign=gpus.foreign_memory.get(g.uuid, 0),
            )
            for g in gpus.devices
        ),
        memory_margin=memory_margin,
        foreign_tolerance=foreign_tolerance,
    )


START_BUDGET_SECONDS = 0.005
"""Longest stretch a pass spends starting jobs before it lets the event loop serve others."""
THREAD_DECIDE_JOBS = 256
"""Above this many ready jobs, the policy decides in a worker thread, off the event loop."""


async def schedule_pass(state: DaemonState) -> list[Placement]:
    """Run one pass: settle, decide and launch. Returns the placements acted on.

    The event loop is never held for long: a large decision runs in a
    worker thread (the state is an immutable snapshot, and only this pass
    starts jobs), and starts are made in slices of `START_BUDGET_SECONDS`
    with a yield between them. Each start only asks the spawner for a shim.
    CPU-only jobs never reach the policy: they hold nothing it allocates,
    so each starts as soon as it is ready.
    """
    if not state.check_state_dir():
        return []
    now = time.time()
    pending = sorted(
        (j for j in state.active.values() if j.state is JobState.QUEUED), key=lambda j: j.id
    )
    per_array: dict[int, int] = {}
    for job in state.active.values():
        if job.state.is_active and job.array_id is not None:
            per_array[job.array_id] = per_array.get(job.array_id, 0) + 1

    ready = readiness(pending, state.dependency_state, per_array, now)
    for job_id, why in ready.never.items():
        state.transition(state.active[job_id], JobState.CANCELLED, why, end_time=now)
    margin = state.config.scheduler.auto_mem_margin

    def learned(job: Job) -> int | None:
        peak = state.store.memory_peak(job.spec.name)
        return None if peak is None else int(peak * (1 + margin))

    cpu_only = [Placement(job.id, ()) for job in ready.ready if job.spec.gpus <= 0]
    cluster = build_state(
        [job for job in ready.ready if job.spec.gpus > 0],
        list(state.active.values()),
        state.gpus,
        state.config.scheduler.memory_margin,
        state.config.scheduler.foreign_tolerance,
        learned,
    )
    if len(cluster.jobs) > THREAD_DECIDE_JOBS:
        decision = await asyncio.to_thread(state.policy.decide, cluster, now)
    else:
        decision = state.policy.decide(cluster, now)
    starts, waiting = placements(cluster, decision)
    reasons = dict(ready.waiting)
    reasons.update(waiting)
    state.waiting_reasons = reasons
    state.next_begin = ready.next_begin
    starts = [*cpu_only, *starts]
    slice_start = time.perf_counter()
    for placement in starts:
        if time.perf_counter() - slice_start > START_BUDGET_SECONDS:
            await asyncio.sleep(0)
            slice_start = time.perf_counter()
            if not state.check_state_dir():
                break
        placed = state.active.get(placement.job_id)
        if placed is not None and placed.state is JobState.QUEUED:
            lifecycle.start(state, placed, placement)
    return starts
