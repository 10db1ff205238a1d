"""show: one job with its event history and its latest metrics sample."""

from __future__ import annotations

from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.protocol import Show


def handle(state: DaemonState, request: Show) -> dict[str, Any]:
    """The job object, every transition with its reason, and the newest runner sample."""
    job = state.with_reason(state.job(request.id))
    events = [event.to_dict() for event in state.store.events(job.id)]
    return {"job": job.to_dict(), "events": events, "metrics": state.store.latest_sample(job.id)}
