"""Readiness: which pending jobs the policy may consider now, and why the others wait.

Holds, begin times, retry back-off, dependencies (on jobs or whole arrays) and
array limits (`%N`) are resolved here, before any policy sees a job; a job
whose dependencies can never be met is reported so the tick cancels it with
the reason. Pure: unit-tested without a daemon.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuq.models import Job, JobState


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

    `never` holds jobs whose dependencies can never be satisfied (one that
    ended the wrong way, or no longer exists): the caller cancels them with
    the reason given.
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
            if dep_state is None:  # submit checks it exists: it was removed since
                never[job.id] = (
                    f"dependency {dep} can never be satisfied: job {dep.job_id} no longer exists"
                )
                break
            verdict = dep.satisfied_by(dep_state)
            if verdict is False:
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
