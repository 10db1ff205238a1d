"""subscribe: stream job, GPU and metrics events until the client goes away."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpuq.daemon.access import job_view
from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.errors import UsageError
from gpuq.protocol import STREAM_TOPICS, Subscribe


async def handle(
    state: DaemonState,
    request: Subscribe,
    emit: Callable[[dict[str, Any]], Awaitable[None]],
    caller: Caller,
) -> dict[str, Any]:
    """Forward events of the requested topics; ends when the daemon stops."""
    unknown = sorted(set(request.topics) - set(STREAM_TOPICS))
    if unknown:
        raise UsageError(
            f"unknown topic(s): {', '.join(unknown)}", f"topics: {', '.join(STREAM_TOPICS)}"
        )
    topics = {"jobs": "job", "gpus": "gpus", "metrics": "metrics"}
    wanted = {topics[t] for t in request.topics}
    queue = state.subscribe()
    try:
        while not state.should_exit.is_set():
            event = await queue.get()
            if event.get("type") in wanted:
                if isinstance(event.get("job"), dict):
                    event = {**event, "job": job_view(state.config, caller, event["job"])}
                await emit(event)
    finally:
        state.unsubscribe(queue)
    return {"closed": "daemon stopping"}
