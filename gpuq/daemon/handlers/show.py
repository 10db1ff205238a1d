"""show: one job (or array) with its event history, attempts and latest metrics sample."""

from __future__ import annotations

import time
from typing import Any

from gpuq.daemon.access import job_view
from gpuq.daemon.history import MIGRATING, attempts, migrations
from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.errors import NotFoundError
from gpuq.models import JobState
from gpuq.protocol import Show


def handle(state: DaemonState, request: Show, caller: Caller) -> dict[str, Any]:
    """The job object, its transitions and attempts, and the newest runner sample.

    For an array's id: the array and every task (`array`, `jobs`).
    """
    now = time.time()
    try:
        job = state.with_reason(state.job(request.id))
    except NotFoundError:
        array = state.store.array(request.id)
        if array is None:
            raise
        tasks = state.resolve_ids([array.id])
        jobs = [
            job_view(state.config, caller, state.with_reason(state.job(task)).to_dict(now=now))
            for task in tasks
        ]
        info = {"id": array.id, "name": array.name, "submit_time": array.submit_time}
        return {"array": {**info, "size": array.size}, "jobs": jobs}
    events = state.store.events(job.id)
    moved = [e.time for e in events if e.reason.startswith(MIGRATING)]
    samples = state.store.samples(job.id, min(moved), None) if moved else []
    times = [float(sample["time"]) for sample in samples if "time" in sample]
    return {
        "job": job_view(state.config, caller, job.to_dict(now=now)),
        "events": [event.to_dict() for event in events],
        "attempts": [attempt.to_dict() for attempt in attempts(events, now)],
        "migrations": [move.to_dict() for move in migrations(events, times)],
        "metrics": state.store.latest_sample(job.id),
        "sizing": state.sizing.get(job.id) if job.state is JobState.RUNNING else None,
    }
