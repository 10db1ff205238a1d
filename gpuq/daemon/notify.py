"""`--notify`: run the job's command once it reaches a final state, whatever the state.

Called by `DaemonState.transition` for every transition into succeeded,
failed, cancelled or lost, so a job cancelled before it started (a held job,
a dependent of a failed job) notifies too. The command runs detached in its
own session, in the job's directory, with the job's environment and the
outcome in `GPUQ_JOB_ID`, `GPUQ_JOB_NAME`, `GPUQ_JOB_STATE` and
`GPUQ_JOB_EXIT_CODE`; its output is discarded.
"""

from __future__ import annotations

import contextlib
import os
import subprocess

from gpuq import env as job_env
from gpuq.daemon.store import Store
from gpuq.models import Job


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
    with contextlib.suppress(OSError):
        subprocess.Popen(  # noqa: S602 - the user's own shell command
            job.spec.notify,
            shell=True,
            cwd=job.spec.cwd if os.path.isdir(job.spec.cwd) else "/",
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
