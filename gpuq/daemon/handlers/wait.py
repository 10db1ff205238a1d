"""wait: block until jobs end (all of them, or any one)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.errors import WaitTimeout
from gpuq.protocol import Wait


async def handle(
    state: DaemonState, request: Wait, emit: Callable[[dict[str, Any]], Awaitable[None]]
) -> dict[str, Any]:
    """Return the jobs once done; each ending job is also sent as an event."""
    for job_id in request.ids:
        state.job(job_id)  # NotFoundError for unknown ids, before waiting
    queue = state.subscribe()
    deadline = None if request.timeout is None else time.monotonic() + request.timeout
    try:
        while True:
            jobs = [state.job(i) for i in request.ids]
            done = [j for j in jobs if j.state.is_terminal]
            if (request.any and done) or len(done) == len(jobs):
                return {"jobs": [j.to_dict() for j in jobs]}
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WaitTimeout(
                    f"{len(jobs) - len(done)} job(s) still not done",
                    "raise --timeout, or check with gpuq ls",
                )
            try:
                event = await asyncio.wait_for(queue.get(), timeout=remaining)
            except TimeoutError:
                continue
            job = event.get("job")
            if event.get("type") == "job" and isinstance(job, dict) and job["id"] in request.ids:
                await emit(event)
    finally:
        state.unsubscribe(queue)
