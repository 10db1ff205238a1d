"""`--notify`: run the job's command once it reaches a final state, whatever the state.

Called by `DaemonState.transition` for every transition into succeeded,
failed, cancelled or lost, so a job cancelled before it started (a held job,
a dependent of a failed job) notifies too. The command runs detached in its
own session, in the job's directory, with the job's environment and the
outcome in `GPUQ_JOB_ID`, `GPUQ_JOB_NAME`, `GPUQ_JOB_STATE` and
`GPUQ_JOB_EXIT_CODE`; its output is discarded.

It runs as the job would: on a lab daemon, which is root, as the job's
owner, with their groups and home, and entering the job's directory as
them; never as root for another user's command.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from typing import Any

from gpuq import env as job_env
from gpuq.daemon.executor import run_as_for
from gpuq.daemon.identity import UnknownAccount
from gpuq.daemon.store import Store
from gpuq.models import Job

log = logging.getLogger("gpuq.daemon")


IN_OWNERS_DIRECTORY = 'cd -- "$1" 2>/dev/null || cd /; exec /bin/sh -c "$2"'
"""Run as the owner, the shell enters the job's directory with the owner's rights."""


def run(store: Store, job: Job) -> None:
    """Start `job`'s notify command (nothing if it has none or it cannot start)."""
    if not job.spec.notify:
        return
    environ = {k: v for k, v in store.full_spec(job.id).env.items() if k not in job_env.CONTRACT}
    environ.update(
        {
            job_env.JOB_ID: str(job.id),
            job_env.JOB_NAME: job.spec.name,
            "GPUQ_JOB_STATE": job.state.value,
            "GPUQ_JOB_EXIT_CODE": "" if job.exit_code is None else str(job.exit_code),
        }
    )
    try:
        owner = run_as_for(job.spec.uid)
    except UnknownAccount as exc:
        log.warning("job %d: not running its --notify command: %s", job.id, exc)
        return
    common: dict[str, Any] = {
        "env": environ,
        "stdin": subprocess.DEVNULL,
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
        "start_new_session": True,
    }
    with contextlib.suppress(OSError):
        if owner is None:
            subprocess.Popen(  # noqa: S602 - the user's own shell command, as the user
                job.spec.notify,
                shell=True,
                cwd=job.spec.cwd if os.path.isdir(job.spec.cwd) else "/",
                **common,
            )
            return
        environ.update({"HOME": owner.home, "USER": owner.name, "LOGNAME": owner.name})
        subprocess.Popen(  # noqa: S603 - the owner's own shell command, as the owner
            ["/bin/sh", "-c", IN_OWNERS_DIRECTORY, "gpuq-notify", job.spec.cwd, job.spec.notify],
            cwd="/",
            user=owner.uid,
            group=owner.gid,
            extra_groups=list(owner.groups),
            **common,
        )
