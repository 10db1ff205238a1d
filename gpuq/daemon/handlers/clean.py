"""clean: delete finished jobs, their directories and their logs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.models import TERMINAL_STATES
from gpuq.protocol import Clean


def handle(state: DaemonState, request: Clean, caller: Caller) -> dict[str, Any]:
    """Remove jobs that ended more than `older_than` seconds ago (a lab's user: their own)."""
    state.require_state_dir()
    cutoff = time.time() - request.older_than
    doomed = [
        j
        for j in state.store.jobs(TERMINAL_STATES)
        if (j.end_time is None or j.end_time <= cutoff)
        and (not state.config.lab.enabled or caller.may_act_on(j.spec.uid))
    ]
    log_dir = state.config.daemon.log_dir
    files: list[Path] = []
    for job in doomed:
        for name in {job.stdout_path, job.stderr_path}:
            # Only logs gpuq placed in its own log directory are gpuq's to delete.
            if name and _in_log_dir(Path(name), log_dir) and Path(name).exists():
                files.append(Path(name))
    freed = sum(f.stat().st_size for f in files)
    if not request.dry_run:
        for path in files:
            path.unlink(missing_ok=True)
        for job in doomed:
            state.node.remove_job_files(job.id)
        state.store.delete(j.id for j in doomed)
    return {
        "ids": [j.id for j in doomed],
        "files": [str(f) for f in files],
        "bytes": freed,
        "dry_run": request.dry_run,
    }


def _in_log_dir(path: Path, log_dir: Path) -> bool:
    """A file gpuq placed: in its log directory, or a lab user's directory of it (users/UID)."""
    return path.parent == log_dir or (
        path.parent.parent == log_dir / "users" and path.parent.name.isdigit()
    )
