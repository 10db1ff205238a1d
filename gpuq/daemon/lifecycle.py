"""Job lifecycle rules: start an attempt, end it, retry, notify.

held -> queued -> starting -> running -> succeeded | failed | cancelled | lost,
with running -> suspending -> suspended -> running (stop and park modes) or
-> queued (checkpoint mode; see `gpuq.daemon.suspend`). Each step is
committed (with its reason) before the process-level action it announces.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from gpuq import env as job_env
from gpuq.daemon import faults, jobfiles, suspend
from gpuq.daemon.executor import LaunchSpec, Outcome
from gpuq.daemon.state import DaemonState
from gpuq.errors import UsageError
from gpuq.models import Job, JobState
from gpuq.policies.base import Placement
from gpuq.units import expand_output_pattern

CANCEL_REQUESTED = "cancel requested"
CHILD_POLL_SECONDS = 0.05
"""How often a cancel looks again for the process group of a job just started."""


def output_paths(state: DaemonState, job: Job) -> tuple[str, str]:
    """Absolute stdout and stderr paths of a job (patterns expanded)."""
    spec = job.spec

    def expand(pattern: str) -> str:
        text = expand_output_pattern(
            pattern, job.id, spec.array_index, job.array_id, spec.name, spec.user
        )
        return str(Path(spec.cwd, text)) if not os.path.isabs(text) else text

    log_dir = state.config.daemon.log_dir
    stdout = expand(spec.output) if spec.output else str(log_dir / f"{job.id}.out")
    if spec.error:
        stderr = expand(spec.error)
    else:
        stderr = stdout if spec.output else str(log_dir / f"{job.id}.err")
    return stdout, stderr


def job_environment(
    state: DaemonState, job: Job, placement: Placement, control_socket: Path | None = None
) -> dict[str, str]:
    """The job's captured environment plus the GPUQ_* contract.

    `job` is the job as `start` recorded it, its `attempts` already counting
    the attempt being launched.
    """
    spec = state.store.full_spec(job.id)
    job_dir = state.executor.job_dir(job.id)
    # A job submitted from inside another job must not inherit that job's values.
    environ = {k: v for k, v in spec.env.items() if k not in job_env.CONTRACT}
    uuids = ",".join(placement.gpu_uuids)
    environ.update(
        {
            job_env.JOB_ID: str(job.id),
            job_env.JOB_NAME: spec.name,
            job_env.GPU_UUIDS: uuids,
            job_env.JOB_DIR: str(job_dir),
            job_env.CHECKPOINT_DIR: str(job_dir / jobfiles.CHECKPOINTS),
            job_env.ATTEMPT: str(job.attempts),
            job_env.NODE: state.config.daemon.node_name,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": uuids,
        }
    )
    if placement.gpu_mem is not None:
        environ[job_env.GPU_MEM] = str(placement.gpu_mem)
    if control_socket is not None:
        environ[job_env.CONTROL_SOCKET] = str(control_socket)
    if spec.array_index is not None:
        environ[job_env.ARRAY_INDEX] = str(spec.array_index)
        environ[job_env.ARRAY_ID] = str(job.array_id or job.id)
    return environ


def start(state: DaemonState, job: Job, placement: Placement) -> None:
    """Start one attempt of `job` on the placement's GPUs."""
    stdout, stderr = output_paths(state, job)
    state.child_pgids.pop(job.id, None)  # an earlier attempt's process group
    job = state.transition(
        job,
        JobState.STARTING,
        f"starting on {', '.join(placement.gpu_uuids) or 'CPU'}",
        gpu_uuids=placement.gpu_uuids,
        gpu_mem_reserved=placement.gpu_mem,
        node=state.config.daemon.node_name,
        attempts=job.attempts + 1,
        stdout_path=stdout,
        stderr_path=stderr,
        exit_code=None,
        signal=None,
        end_time=None,
    )
    spec = job.spec
    try:
        for path in {stdout, stderr}:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        launch = LaunchSpec(
            command=spec.command,
            cwd=spec.cwd,
            env=job_environment(state, job, placement, state.control.open(job.id)),
            stdout=stdout,
            stderr=stderr,
            time_limit=spec.time_limit,
            signal=None if spec.signal is None else (spec.signal.signal, spec.signal.seconds),
            kill_grace=state.config.daemon.kill_grace,
        )
        faults.crash_point("starting-committed")
        pid = state.executor.launch(job.id, launch)
        faults.crash_point("shim-spawned")
    except (OSError, RuntimeError) as exc:
        state.control.close(job.id)
        state.transition(job, JobState.FAILED, f"could not start: {exc}", end_time=time.time())
        return
    job = state.transition(job, JobState.RUNNING, "started", start_time=time.time())
    watch(state, job.id, pid)


def watch(state: DaemonState, job_id: int, pid: int) -> None:
    """Have `finish` called when the job's shim ends."""
    loop = asyncio.get_running_loop()
    state.executor.watch(loop, job_id, pid, lambda jid, out: finish(state, jid, out))


def finish(state: DaemonState, job_id: int, outcome: Outcome) -> None:
    """Record how an attempt ended, and retry or notify as the spec asks."""
    job = state.active.get(job_id)
    if job is None or job.state.is_terminal:
        return
    faults.crash_point("exit-observed")
    state.control.close(job_id)
    end_time = outcome.end_time or time.time()
    peak = state.memory_peaks.pop(job_id, None)
    if peak:
        state.store.record_memory_peak(job.spec.name, peak, end_time)
    fields = {"exit_code": outcome.exit_code, "signal": outcome.signal, "end_time": end_time}
    if cancel_requested(state, job):
        state.transition(job, JobState.CANCELLED, "cancelled by user", **fields)
    elif suspend.suspended_by_exit(state, job, outcome):
        return
    elif outcome.returncode == 0:
        state.transition(job, JobState.SUCCEEDED, outcome.reason or "exited with code 0", **fields)
    else:
        if outcome.returncode is None:
            ended, why = JobState.LOST, outcome.reason
        else:
            ended = JobState.FAILED
            sig = f" ({outcome.signal})" if outcome.signal else ""
            why = outcome.reason or f"exited with code {outcome.exit_code}{sig}"
        tries = job.attempts - state.store.checkpoint_restarts(job.id, job.attempts)
        if tries <= job.spec.retries:
            retry = f"{why}; retrying (attempt {tries + 1} of {job.spec.retries + 1})"
            state.transition(
                job, JobState.QUEUED, retry, gpu_uuids=(), gpu_mem_reserved=None, **fields
            )
            return
        state.transition(job, ended, why, **fields)
    notify(state, job_id)


def cancel_requested(state: DaemonState, job: Job) -> bool:
    """True if a cancel was asked for during the current attempt."""
    for event in reversed(state.store.events(job.id)):
        if event.reason == CANCEL_REQUESTED:
            return True
        if event.state is JobState.STARTING:
            return False
    return False


def request_cancel(state: DaemonState, job: Job) -> Job:
    """Cancel a job: at once if pending, else TERM its group, KILL after grace."""
    if not job.state.is_active or suspend.is_checkpointed(state, job):
        return state.transition(job, JobState.CANCELLED, "cancelled by user", end_time=time.time())
    job = state.transition(job, job.state, CANCEL_REQUESTED)
    _terminate(state, job.id, job.attempts)
    return job


def _terminate(state: DaemonState, job_id: int, attempt: int) -> None:
    """TERM the attempt's process group now and KILL it after the grace period.

    A job cancelled the moment it turned running may not have recorded its
    process group yet (the shim does so just after starting the command), so
    this tries again shortly for as long as the attempt is still active.
    """
    job = state.active.get(job_id)
    if job is None or not job.state.is_active or job.attempts != attempt:
        return
    loop = asyncio.get_running_loop()
    if not state.executor.signal(job_id, signal.SIGTERM):
        loop.call_later(CHILD_POLL_SECONDS, _terminate, state, job_id, attempt)
        return
    state.executor.signal(job_id, signal.SIGCONT)  # a stopped job must wake to die
    loop.call_later(state.config.daemon.kill_grace, _kill, state, job_id, attempt)


def resume_cancel(state: DaemonState, job: Job) -> None:
    """Carry on a cancel a previous daemon started (its KILL timer died with it)."""
    _terminate(state, job.id, job.attempts)


def _kill(state: DaemonState, job_id: int, attempt: int) -> None:
    """SIGKILL what is left of the attempt's process group (not a later attempt's)."""
    job = state.active.get(job_id)
    if job is not None and job.attempts == attempt:
        state.executor.signal(job_id, signal.SIGKILL)


def notify(state: DaemonState, job_id: int) -> None:
    """Run the job's `--notify` command, detached, with the outcome in its env."""
    job = state.store.get(job_id)
    if job is None or not job.spec.notify:
        return
    environ = dict(state.store.full_spec(job_id).env)
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


def check_runnable_command(command: tuple[str, ...], cwd: str, path_env: str | None) -> None:
    """Reject a missing cwd or a command that cannot be found, with a hint."""
    if not os.path.isdir(cwd):
        raise UsageError(f"working directory {cwd!r} does not exist", "pass an existing --cwd")
    program = command[0]
    if "/" in program:
        target = Path(cwd, program)
        if not target.is_file():
            raise UsageError(f"no such file: {program!r} (relative to {cwd})")
        if not os.access(target, os.X_OK):
            raise UsageError(
                f"{program!r} is not executable",
                f"chmod +x {program}, or run it via its interpreter",
            )
        return
    if shutil.which(program, path=path_env) is None:
        raise UsageError(f"command not found: {program!r}", "check the spelling and the job's PATH")
