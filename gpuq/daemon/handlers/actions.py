"""cancel, hold, release, retry, priority, suspend, resume.

The bulk job actions share this module: each is one small rule applied to
every id given, and each id gets its own outcome, so one bad id does not stop
the others (the CLI exits non-zero if any failed). An array's id stands for
the tasks the action applies to: `gpuq hold ARRAY` holds its queued tasks
and passes over the running ones, and `gpuq cancel ARRAY` again, after a
cancel cut short, cancels what is left. Only an array none of whose tasks
it applies to is a failure, with the tasks' states.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
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

APPLIES_TO: dict[type[Action], frozenset[JobState]] = {
    Cancel: frozenset(s for s in JobState if not s.is_terminal),
    Hold: frozenset({JobState.QUEUED, JobState.HELD}),
    Release: frozenset({JobState.HELD}),
    Retry: frozenset({JobState.FAILED, JobState.CANCELLED, JobState.LOST}),
    SetPriority: frozenset({JobState.QUEUED, JobState.HELD}),
    Suspend: frozenset({JobState.RUNNING}),
    Resume: frozenset({JobState.SUSPENDED, JobState.SUSPENDING}),
}
"""The states of a job each action applies to; an array's tasks in others are passed over."""

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
            job = state.require(job_id, APPLIES_TO[Hold], "hold")
            if job.state is JobState.QUEUED:
                job = state.transition(job, JobState.HELD, "held by user")
            return job.state.value
        case Release():
            job = state.require(job_id, APPLIES_TO[Release], "release")
            return state.transition(job, JobState.QUEUED, "released by user").state.value
        case Retry():
            job = state.require(job_id, APPLIES_TO[Retry], "retry")
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
            job = state.require(job_id, APPLIES_TO[SetPriority], "change the priority of")
            updated = state.store.set_priority(job, request.priority, time.time())
            state.active[job_id] = updated
            state.wake.set()
            return updated.state.value
        case Suspend():
            job = state.require(job_id, APPLIES_TO[Suspend], "suspend")
            return suspend.request(state, job, request.mode).state.value
        case Resume():
            job = state.require(job_id, APPLIES_TO[Resume], "resume")
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
    outcomes: list[ActionOutcome] = []
    done: set[int] = set()
    slice_start = time.perf_counter()
    for given in dict.fromkeys(request.ids):
        tasks = state.array_tasks(given)
        passed_over: Counter[str] = Counter()
        applied = False
        for job_id in tasks or [given]:
            if job_id in done:
                continue
            done.add(job_id)
            if time.perf_counter() - slice_start > SLICE_SECONDS:
                await asyncio.sleep(0)
                slice_start = time.perf_counter()
            if tasks and (now := state.job(job_id).state) not in APPLIES_TO[type(request)]:
                passed_over[now.value] += 1  # the array's other tasks are the ones meant
                continue
            try:
                ended_in = _apply(state, request, job_id, caller)
            except GpuqError as exc:
                outcomes.append(ActionOutcome(job_id, False, exc.message, code=exc.code))
                continue
            message = ""
            if isinstance(request, Cancel) and ended_in != JobState.CANCELLED.value:
                message = lifecycle.CANCEL_REQUESTED
            outcomes.append(ActionOutcome(job_id, True, message, state=ended_in))
            applied = True
        if passed_over and not applied:  # none of its tasks was in a state the action applies to
            verb = METHOD_NAMES[type(request)]
            states = ", ".join(f"{n} {name}" for name, n in sorted(passed_over.items()))
            outcomes.append(
                ActionOutcome(
                    given,
                    False,
                    f"array {given} has no task to {_VERBS.get(verb, verb)} ({states})",
                    code=ConflictError.code,
                )
            )
    return {"results": [o.to_dict() for o in outcomes]}
