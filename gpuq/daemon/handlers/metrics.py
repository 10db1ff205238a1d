"""metrics: the samples a job's gpuq.runner reported, oldest first."""

from __future__ import annotations

from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.errors import UsageError
from gpuq.protocol import JobMetrics


def handle(state: DaemonState, request: JobMetrics) -> dict[str, Any]:
    """Samples taken after `since` (the newest `limit` of them); not_found for no such job."""
    job = state.job(request.id)
    if request.limit is not None and request.limit < 0:
        raise UsageError("metrics.limit must be 0 or more")
    return {"job": job.id, "samples": state.store.samples(job.id, request.since, request.limit)}
