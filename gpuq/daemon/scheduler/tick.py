"""The tick: one scheduler pass, run by the server whenever something changed.

It runs explicit, ordered steps on the event loop: decide which pending jobs
are ready (`readiness`), cancel those whose dependencies can never be met,
build the policy's state (`view`), call the policy (in a worker thread when
the state is large), bind its decision to GPUs (`binding`), and start what
it placed, in slices with yields between them.
"""

from __future__ import annotations

import asyncio
import time

from gpuq.daemon import lifecycle
from gpuq.daemon.scheduler.binding import Placement, placements
from gpuq.daemon.scheduler.readiness import readiness
from gpuq.daemon.scheduler.view import build_state
from gpuq.daemon.state import DaemonState
from gpuq.models import Job, JobState

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
