"""cancel, hold, release, retry, priority, suspend, resume.

The bulk job actions share this module: each is one small rule applied to
every id given, and each id gets its own outcome, so one bad id does not stop
the others (the CLI exits non-zero if any failed).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, assert_never

from gpuq.daemon import lifecycle, suspend
from gpuq.daemon.access import require_owner, require_priority
from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.errors import ConflictError, GpuqError, UsageError
from gpuq.models import JobState
from gpuq.protocol import (
    METHOD_NAMES,
    SUSPEND_MODES,
    ActionOutcome,
    Cancel,
    Hold,
    Release,
    Resume,
    Retry,
    SetPriority,
    Suspend,
)

Action = Cancel | Hold | Release | Retry | SetPriority | Suspend | Resume

_VERBS = {"priority": "change the priority of"}

SLICE_SECONDS = 0.005
"""Longest stretch an action spends on its jobs before it yields the event loop."""


def _apply(state: DaemonState, request: Action, job_id: int, caller: Caller) -> str:
    """Apply the action to one job; returns the job's resulting state."""
    verb = METHOD_NAMES[type(request)]
    require_owner(state.config, caller, state.job(job_id), _VERBS.get(verb, verb))
    match request:
        case Cancel():
            job = state.job(job_id)
            if job.state.is_terminal:
                raise ConflictError(f"job {job_id} already ended ({job.state.value})")
            return lifecycle.request_cancel(state, job).state.value
        case Hold():
            job = state.require(job_id, {JobState.QUEUED, JobState.HELD}, "hold")
            if job.state is JobState.QUEUED:
                job = state.transition(job, JobState.HELD, "held by user")
            return job.state.value
        case Release():
            job = state.require(job_id, {JobState.HELD}, "release")
            return state.transition(job, JobState.QUEUED, "released by user").state.value
        case Retry():
            job = state.require(
                job_id, {JobState.FAILED, JobState.CANCELLED, JobState.LOST}, "retry"
            )
            return state.transition(
                job,
                JobState.QUEUED,
                "retried by user",
                exit_code=None,
                signal=None,
                end_time=None,
                gpu_uuids=(),
                gpu_mem_reserved=None,
            ).state.value
        case SetPriority():
            job = state.require(job_id, {JobState.QUEUED, JobState.HELD}, "change the priority of")
            updated = state.store.set_priority(job, request.priority, time.time())
            state.active[job_id] = updated
            state.wake.set()
            return updated.state.value
        case Suspend():
            job = state.require(job_id, {JobState.RUNNING}, "suspend")
            return suspend.request(state, job, request.mode).state.value
        case Resume():
            job = state.require(job_id, {JobState.SUSPENDED, JobState.SUSPENDING}, "resume")
            return suspend.resume(state, job).state.value
        case _:
            assert_never(request)


async def handle(state: DaemonState, request: Action, caller: Caller) -> dict[str, Any]:
    """Apply the action to each id; report per-job outcomes.

    Releasing or cancelling a 5,000-task array commits 5,000 transitions:
    the loop is let go every `SLICE_SECONDS`, so other clients are served
    meanwhile.
    """
    if isinstance(request, Suspend) and request.mode not in SUSPEND_MODES:
        raise UsageError(
            f"unknown suspend mode {request.mode!r}", f"modes: {', '.join(SUSPEND_MODES)}"
        )
    if isinstance(request, SetPriority):
        require_priority(state.config, caller, request.priority)
    state.require_state_dir()
    outcomes = []
    slice_start = time.perf_counter()
    for job_id in state.resolve_ids(request.ids):
        if time.perf_counter() - slice_start > SLICE_SECONDS:
            await asyncio.sleep(0)
            slice_start = time.perf_counter()
        try:
            ended_in = _apply(state, request, job_id, caller)
            message = ""
            if isinstance(request, Cancel) and ended_in != JobState.CANCELLED.value:
                message = lifecycle.CANCEL_REQUESTED
            outcomes.append(ActionOutcome(job_id, True, message, state=ended_in))
        except GpuqError as exc:
            outcomes.append(ActionOutcome(job_id, False, exc.message, code=exc.code))
    return {"results": [o.to_dict() for o in outcomes]}
