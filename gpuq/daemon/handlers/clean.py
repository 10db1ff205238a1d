"""clean: delete finished jobs, their directories and their logs."""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from gpuq.daemon.executor import lab_owner
from gpuq.daemon.identity import Caller
from gpuq.daemon.outputs import default_logs
from gpuq.daemon.state import DaemonState
from gpuq.models import TERMINAL_STATES, Job
from gpuq.protocol import Clean

log = logging.getLogger(__name__)


def handle(state: DaemonState, request: Clean, caller: Caller) -> dict[str, Any]:
    """Remove jobs that ended more than `older_than` seconds ago (a lab's user: their own).

    A finished job still in use is kept, and named in `kept`: one an
    unfinished job depends on (`--after`), which the dependent could then
    never meet; one a `gpuq wait` is waiting on, whose answer it would be;
    and a task of an array that has not ended, whose outcome (ok only if
    every task succeeded) it is part of.
    """
    state.require_state_dir()
    cutoff = time.time() - request.older_than
    ended = [
        j
        for j in state.store.jobs(TERMINAL_STATES)
        if (j.end_time is None or j.end_time <= cutoff)
        and (not state.config.lab.enabled or caller.may_act_on(j.spec.uid))
    ]
    needed = _in_use(state)
    doomed = [j for j in ended if j.id not in needed]
    files = [path for job in doomed for path in _gpuq_logs(state, job)]
    freed = sum(size for _, size in files)
    if not request.dry_run:
        for path, _ in files:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # a directory the user made in its place: theirs to remove
                log.warning("clean: cannot remove %s: %s", path, exc.strerror)
        for job in doomed:
            state.node.remove_job_files(job.id)
        state.store.delete(j.id for j in doomed)
    return {
        "ids": [j.id for j in doomed],
        "files": [str(path) for path, _ in files],
        "bytes": freed,
        "dry_run": request.dry_run,
        "kept": [j.id for j in ended if j.id in needed],
    }


def _in_use(state: DaemonState) -> set[int]:
    """The ids of jobs `clean` must keep (see `handle`): depended on, awaited, in a live array."""
    depended = {dep.job_id for job in state.active.values() for dep in job.spec.after}
    live = {job.array_id for job in state.active.values() if job.array_id is not None}
    needed = set(state.awaited) | depended  # a wait's ids are tasks already, never arrays
    for array_id in live | depended:
        if state.store.array(array_id):
            needed.update(state.store.array_task_ids(array_id))
    return needed


def _gpuq_logs(state: DaemonState, job: Job) -> list[tuple[Path, int]]:
    """The job's logs that gpuq named itself here, with their sizes: the only ones it deletes.

    Those are its default logs (no --output, no --error) in the log
    directory, or in its owner's own directory of it on a lab daemon. A path
    the user gave is theirs, even one inside the log directory: on a lab
    daemon, which deletes as root, it may name another user's log. A link
    found in a default log's place is removed, never followed, not even to
    measure its target.
    """
    spec = job.spec
    named = default_logs(
        state.config.daemon.log_dir, job.id, lab_owner(spec.uid), spec.output, spec.error
    )
    found = []
    for path in named.values():
        if str(path) not in (job.stdout_path, job.stderr_path):
            continue  # the job ran elsewhere, its logs with it
        try:
            info = os.lstat(path)
        except OSError:
            continue
        found.append((path, info.st_size if stat.S_ISREG(info.st_mode) else 0))
    return found
