"""wait: block until jobs end (all of them, or any one)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.errors import WaitTimeout
from gpuq.models import JobState
from gpuq.protocol import Wait

RECHECK_SECONDS = 1.0
"""How often the jobs still awaited are looked up, in case their events were dropped."""

_FINAL = frozenset(state.value for state in JobState if state.is_terminal)


async def handle(
    state: DaemonState, request: Wait, emit: Callable[[dict[str, Any]], Awaitable[None]]
) -> dict[str, Any]:
    """Return the jobs once done; each ending job is also sent as an event.

    Only the jobs still awaited are tracked, from their events: waiting on a
    5,000-task array costs a set update per event, not a scan of the array.
    A subscriber that falls behind loses events, so the awaited jobs are also
    looked up every `RECHECK_SECONDS`.
    """
    ids = state.resolve_ids(request.ids)
    for job_id in ids:
        state.job(job_id)  # NotFoundError for unknown ids, before waiting
    wanted = set(ids)
    queue = state.subscribe()
    state.awaited.update(wanted)  # `gpuq clean` keeps them until the answer is out
    deadline = None if request.timeout is None else time.monotonic() + request.timeout
    try:
        awaited = {i for i in wanted if not state.job(i).state.is_terminal}
        while awaited and not (request.any and len(awaited) < len(wanted)):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimeout(
                    f"{len(awaited)} job(s) still not done",
                    "raise --timeout, or check with gpuq ls",
                )
            timeout = RECHECK_SECONDS if remaining is None else min(remaining, RECHECK_SECONDS)
            try:
                event = await asyncio.wait_for(queue.get(), timeout=timeout)
            except TimeoutError:
                awaited = {i for i in awaited if not state.job(i).state.is_terminal}
                continue
            job = event.get("job")
            if event.get("type") == "job" and isinstance(job, dict) and job["id"] in wanted:
                await emit(event)
                if job["state"] in _FINAL:
                    awaited.discard(job["id"])
        return {"jobs": [state.job(i).to_dict() for i in ids]}
    finally:
        state.awaited.subtract(wanted)
        state.awaited += Counter()  # drops the jobs no wait holds any more
        state.unsubscribe(queue)
