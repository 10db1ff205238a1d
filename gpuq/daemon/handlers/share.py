"""share: each user's fair share, usage and jobs on a lab daemon (`gpuq share`)."""

from __future__ import annotations

import time
from typing import Any

from gpuq.daemon.scheduler.usage import HOLDING, share_rows
from gpuq.daemon.state import DaemonState
from gpuq.errors import UsageError
from gpuq.models import Job, JobState
from gpuq.protocol import Share


def handle(state: DaemonState, request: Share) -> dict[str, Any]:
    """One row per user with a job or a recorded usage, with their running and waiting jobs."""
    if not state.config.lab.enabled:
        raise UsageError(
            "this daemon has no fair share: it is a personal daemon",
            "fair share is a lab daemon's ([lab] enabled = true)",
        )
    rows = share_rows(state, time.time())
    by_user: dict[str, list[Job]] = {}
    for job in state.active.values():
        by_user.setdefault(job.spec.user, []).append(job)
    for row in rows:
        jobs = by_user.get(str(row["user"]), [])
        row["running"] = sum(1 for j in jobs if j.state in HOLDING)
        row["gpus"] = sum(len(j.gpu_uuids) for j in jobs if j.state in HOLDING)
        row["waiting"] = sum(1 for j in jobs if j.state in (JobState.QUEUED, JobState.HELD))
    lab = state.config.lab
    return {
        "users": rows,
        "half_life": lab.half_life,
        "aging": lab.aging,
        "limits": {
            "max_gpus": lab.max_gpus,
            "max_running": lab.max_running,
            "max_queued": lab.max_queued,
            "max_priority": lab.max_priority,
        },
    }
