"""Job lifecycle rules: start an attempt, end it, retry with backoff.

held -> queued -> starting -> running -> succeeded | failed | cancelled | lost,
with running -> suspending -> suspended -> running (stop and park modes) or
-> queued (checkpoint mode; see `gpuq.daemon.suspend`), and running ->
queued for a job that ran out of GPU memory while packed (`gpuq.daemon.oom`).
Each step is committed (with its reason) before the process-level action it
announces.

Starting never blocks the event loop: `start` commits `starting`, writes the
launch record and hands the spawn to the executor; the job turns `running`
when its shim exists (`_spawned`). An outcome that cannot be committed (a
full disk) is kept in `DaemonState.unrecorded` and recorded again each
second (`record_pending`); the job keeps its GPUs until then.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

from gpuq import env as job_env
from gpuq.daemon import faults, incoming, jobfiles, oom, suspend, transfer
from gpuq.daemon.executor import LaunchSpec, Outcome, lab_owner, run_as_for
from gpuq.daemon.identity import Account, UnknownAccount
from gpuq.daemon.node.gang import GangNode, Part, address_toward
from gpuq.daemon.outputs import USERS_DIR, default_logs, user_log_dir
from gpuq.daemon.scheduler.binding import Placement
from gpuq.daemon.spawner import Spawned
from gpuq.daemon.state import DaemonState
from gpuq.errors import StateError, UsageError
from gpuq.models import Job, JobState
from gpuq.units import expand_output_pattern, format_duration

log = logging.getLogger("gpuq.daemon")

CANCEL_REQUESTED = "cancel requested"
CHILD_POLL_SECONDS = 0.05
"""How often a cancel looks again for the process group of a job just started."""
RETRY_BASE_SECONDS = 1.0
RETRY_MAX_SECONDS = 300.0
"""Retries back off: 1 s, 2 s, 4 s ... up to 5 minutes between attempts."""
FULL_DISK_PAUSE = 5.0
"""Seconds a job waits before another start when its files could not be written."""
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def retry_delay(retries_done: int) -> float:
    """Seconds to wait before the next retry, after `retries_done` of them (0 for the first)."""
    return float(min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2.0 ** min(retries_done, 20)))


def output_targets(
    state: DaemonState, job: Job, node: str | None = None
) -> tuple[str, str, dict[str, str]]:
    """Absolute stdout and stderr paths, and where missing directories may be created.

    Relative patterns are taken from the job's working directory, and
    directories are created only below it; gpuq's own log directory (on the
    node the job runs on, `node`: by default its last) is created as
    needed; an absolute pattern's directory must exist. A job that runs as
    its owner (lab mode) keeps its default logs in that user's own
    directory there (`outputs.user_log_dir`; on another server, the one
    its daemon keeps for this head's jobs).
    """
    spec = job.spec
    log_dir = state.config.daemon.log_dir
    remote = state.remotes.get(job.node if node is None else node)
    if remote is not None and remote.mirror is not None:
        log_dir = remote.log_dir
    defaults = default_logs(log_dir, job.id, lab_owner(spec.uid), spec.output, spec.error)
    below = {str(path): str(path.parent) for path in defaults.values()}

    def expand(pattern: str) -> str:
        text = expand_output_pattern(
            pattern, job.id, spec.array_index, job.array_id, spec.name, spec.user
        )
        if os.path.isabs(text):
            return text
        path = str(Path(spec.cwd, text))
        below[path] = spec.cwd
        return path

    stdout = expand(spec.output) if spec.output else str(defaults["stdout"])
    if spec.error:
        stderr = expand(spec.error)
    else:
        stderr = stdout if spec.output else str(defaults["stderr"])
    return stdout, stderr, below


def output_paths(state: DaemonState, job: Job) -> tuple[str, str]:
    """Absolute stdout and stderr paths of a job (patterns expanded)."""
    stdout, stderr, _ = output_targets(state, job)
    return stdout, stderr


def job_environment(
    state: DaemonState, job: Job, placement: Placement, control_socket: Path | None = None
) -> dict[str, str]:
    """The job's captured environment plus the GPUQ_* contract.

    `job` is the job as `start` recorded it, its `attempts` already counting
    the attempt being launched.
    """
    spec = state.store.full_spec(job.id)
    job_dir = state.node_of(job.id).job_dir(job.id)
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
            job_env.NODE: job.node or state.config.daemon.node_name,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": uuids,
        }
    )
    if placement.gpu_mem is not None:
        environ[job_env.GPU_MEM] = str(placement.gpu_mem)
    if types := state.gpu_types(placement.gpu_uuids):
        environ[job_env.GPU_TYPE] = types
    environ.update(state.node_of(job.id).device_env())
    if control_socket is not None:
        environ[job_env.CONTROL_SOCKET] = str(control_socket)
    if spec.array_index is not None:
        environ[job_env.ARRAY_INDEX] = str(spec.array_index)
        environ[job_env.ARRAY_ID] = str(job.array_id or job.id)
    return environ


def start(state: DaemonState, job: Job, placement: Placement, note: str = "") -> None:
    """Start one attempt of `job` on the placement's GPUs; returns once the spawn is asked.

    `note` says why there, if the reason is worth telling ("moved to GPU 1: ...").
    """
    if job.spec.multi_node:
        _start_parts(state, job, placement, note)
        return
    node = state.gpu_node(placement.gpu_uuids)
    source = transfer.checkpoint_source(state, job, node)
    stdout, stderr, below = output_targets(state, job, node)
    state.child_pgids.pop(job.id, None)  # an earlier attempt's process group
    where = ", ".join(placement.gpu_uuids) or "CPU"
    if node in state.remotes:
        where = f"{node}: {where}"
    why = f": {placement.reason}" if placement.reason else ""
    reason = f"starting on {where}{why} ({note})" if note else f"starting on {where}{why}"
    if source is not None:
        reason += f"; its checkpoint is copied from {source} first"
    elif node == state.node.name and job.node and job.node != node:
        copy = incoming.safety_copy(state.node.job_dir(job.id))
        if copy is not None:
            reason += f"; it resumes from its checkpoint at step {copy['step']} kept here"
    job = state.transition(
        job,
        JobState.STARTING,
        reason,
        gpu_uuids=placement.gpu_uuids,
        gpu_mem_reserved=placement.gpu_mem,
        node=node if source is None else source,  # where its checkpoint is, until it is copied
        attempts=job.attempts + 1,
        stdout_path=stdout,
        stderr_path=stderr,
        exit_code=None,
        signal=None,
        end_time=None,
        retry_at=None,
    )
    if source is None:
        _launch(state, job, placement, stdout, stderr, below)
        return
    job_id = job.id

    def copied() -> None:
        current = state.active[job_id]
        if cancel_requested(state, current):
            state.transition(current, JobState.CANCELLED, "cancelled by user", end_time=time.time())
        else:
            _launch(state, current, placement, stdout, stderr, below)

    transfer.begin(state, job, source, node, copied)


def _start_parts(state: DaemonState, job: Job, placement: Placement, note: str) -> None:
    """Start a multi-node job: a part on each server of the placement (`gpuq.daemon.node.gang`)."""
    groups = state.gpu_nodes(placement.gpu_uuids)
    names = list(groups)
    parts = [Part(state.node_named(name), rank, groups[name]) for rank, name in enumerate(names)]
    stdout, stderr, below = output_targets(state, job, names[0])
    state.child_pgids.pop(job.id, None)
    where = "; ".join(f"{name}: {', '.join(uuids)}" for name, uuids in groups.items())
    why = f": {placement.reason}" if placement.reason else ""
    reason = f"starting {len(names)} parts on {where}{why}" + (f" ({note})" if note else "")
    master, unknown = rendezvous_address(state, names)
    if master is None:
        remote = state.remotes.get(unknown)
        cause = f": {remote.address_error}" if remote is not None and remote.address_error else ""
        state.transition(
            job,
            job.state,
            f"waiting for the address of {unknown}, where a part would run{cause}",
            retry_at=time.time() + state.config.cluster.heartbeat,
        )
        return
    job = state.transition(
        job,
        JobState.STARTING,
        reason,
        gpu_uuids=placement.gpu_uuids,
        gpu_mem_reserved=None,
        node=",".join(names),
        attempts=job.attempts + 1,
        stdout_path=stdout,
        stderr_path=stderr,
        exit_code=None,
        signal=None,
        end_time=None,
        retry_at=None,
    )
    job_id = job.id

    def outputs(name: str, rank: int) -> tuple[str, str, dict[str, str]]:
        return output_targets(state, state.active.get(job_id, job), name)

    state.gangs[job.id] = GangNode(parts, master, outputs, lambda: state.config.daemon.kill_grace)
    _launch(state, job, placement, stdout, stderr, below)


def rendezvous_address(state: DaemonState, names: list[str]) -> tuple[str | None, str]:
    """MASTER_ADDR of a multi-node job on `names` (rank 0 first), or None and whose is unknown.

    Rank 0 on another server: the address ssh reaches it at. Rank 0 here:
    this machine's address on the route to the next part's server.
    """
    first = state.remotes.get(names[0])
    if first is not None:
        return first.address, "" if first.address else names[0]
    peer = next((state.remotes[name] for name in names[1:] if name in state.remotes), None)
    if peer is None or peer.address is None:
        return None, names[1] if len(names) > 1 else names[0]
    try:
        return address_toward(peer.address), ""
    except OSError as exc:
        log.warning("no route to %s (%s): %s", peer.name, peer.address, exc)
        return None, names[0]


def _launch(
    state: DaemonState,
    job: Job,
    placement: Placement,
    stdout: str,
    stderr: str,
    below: dict[str, str],
) -> None:
    """Ask the job's node to start the attempt `start` recorded."""
    spec = job.spec
    attempt = job.attempts
    try:
        run_as = run_as_for(spec.uid)
    except UnknownAccount as exc:
        state.transition(job, JobState.FAILED, f"could not start: {exc}", end_time=time.time())
        return
    try:
        if run_as is not None:
            _make_user_log_dir(state, run_as, below)
        launch = LaunchSpec(
            command=spec.command,
            cwd=spec.cwd,
            env=job_environment(state, job, placement, state.node_of(job.id).control.open(job.id)),
            stdout=stdout,
            stderr=stderr,
            time_limit=spec.time_limit,
            signal=None if spec.signal is None else (spec.signal.signal, spec.signal.seconds),
            kill_grace=state.config.daemon.kill_grace,
            create_below=below,
            max_log_bytes=state.config.logs.max_size or None,
            run_as=run_as,
        )
        faults.crash_point("starting-committed")
        state.node_of(job.id).launch(
            job.id, launch, lambda spawned: _spawned(state, job.id, attempt, spawned)
        )
        if not state.unrecorded:
            state.clear_disk_full()  # this job's files were written: there is room again
    except OSError as exc:
        state.node_of(job.id).control.close(job.id)
        if exc.errno in DISK_FULL_ERRNOS:
            _requeue_for_space(state, job, exc)
        else:
            state.transition(job, JobState.FAILED, f"could not start: {exc}", end_time=time.time())
    except RuntimeError as exc:
        state.node_of(job.id).control.close(job.id)
        state.transition(job, JobState.FAILED, f"could not start: {exc}", end_time=time.time())


def _make_user_log_dir(state: DaemonState, account: Account, below: dict[str, str]) -> None:
    """Make the user's own log directory here if the job's default logs go there (OSError)."""
    log_dir = state.config.daemon.log_dir
    if str(log_dir / USERS_DIR / str(account.uid)) in below.values():
        user_log_dir(log_dir, account.uid, account.gid)


def _requeue_for_space(state: DaemonState, job: Job, exc: OSError) -> None:
    """Put back a job whose files could not be written, and tell the user the disk is full."""
    state.report_disk_full(f"cannot write the files of job {job.id}: {exc.strerror}")
    state.transition(
        job,
        JobState.QUEUED,
        f"requeued: the state directory is full ({exc.strerror}); trying again",
        attempts=max(0, job.attempts - 1),
        gpu_uuids=(),
        gpu_mem_reserved=None,
        retry_at=time.time() + FULL_DISK_PAUSE,
    )


def _spawned(state: DaemonState, job_id: int, attempt: int, spawned: Spawned) -> None:
    """The spawner answered for one attempt: the job runs, or did not start."""
    job = state.active.get(job_id)
    current = job is not None and job.attempts == attempt and job.state is JobState.STARTING
    if spawned.pid is None:
        if job is None or not current:
            return
        state.node_of(job_id).control.close(job_id)
        if job.spec.multi_node or state.node_of(job_id).live_shim(job_id) is None:
            state.gangs.pop(job_id, None)  # its parts that started were killed
            state.transition(
                job,
                JobState.QUEUED,
                f"requeued: {spawned.error}",
                attempts=max(0, job.attempts - 1),
                gpu_uuids=(),
                gpu_mem_reserved=None,
            )
            return
        # The spawner forked the shim and died before answering: adopt it.
        shim = state.node_of(job_id).read_record(job_id, jobfiles.SHIM)
        assert shim is not None
        spawned = Spawned(int(shim["pid"]), None)
        state.node_of(job_id).control.open(job_id)
    faults.crash_point("shim-spawned")
    if job is None or not current:  # cannot happen: a starting job stays until its shim ends
        log.error("job %s: a shim started for attempt %d, which is not current", job_id, attempt)
    else:
        state.transition(job, JobState.RUNNING, "started", start_time=time.time())
    watch(state, job_id, spawned.pid or 0, spawned.pidfd)


def watch(state: DaemonState, job_id: int, pid: int, pidfd: int | None = None) -> None:
    """Have `finish` called when the job's shim ends."""
    state.node_of(job_id).watch(job_id, pid, lambda jid, out: finish(state, jid, out), pidfd)


def finish(state: DaemonState, job_id: int, outcome: Outcome) -> None:
    """Record how an attempt ended, and retry as the spec asks.

    If the state cannot be written (a full disk), the outcome is kept in
    memory, the job keeps its GPUs, and `record_pending` tries again.
    """
    job = state.active.get(job_id)
    if job is None or job.state.is_terminal:
        state.unrecorded.pop(job_id, None)
        return
    faults.crash_point("exit-observed")
    try:
        _record(state, job, outcome)
    except StateError as exc:
        if job_id not in state.unrecorded:
            log.warning("job %d ended but its outcome cannot be recorded yet: %s", job_id, exc)
        state.unrecorded[job_id] = outcome
        state.report_disk_full(f"cannot record how job {job_id} ended: {exc.message}")
        state.active[job_id] = replace(
            job, reason=f"ended ({_describe(outcome)}); recording it waits for disk space"
        )
        return
    state.unrecorded.pop(job_id, None)


def record_pending(state: DaemonState) -> None:
    """Try again to record every outcome a full disk held back."""
    for job_id, outcome in list(state.unrecorded.items()):
        finish(state, job_id, outcome)
    if not state.unrecorded:
        state.clear_disk_full()


def _describe(outcome: Outcome) -> str:
    """`exit 0`, `exit 137 (SIGKILL)` or the reason, for messages."""
    if outcome.exit_code is None:
        return outcome.reason or "no exit status"
    return f"exit {outcome.exit_code}" + (f" ({outcome.signal})" if outcome.signal else "")


def _record(state: DaemonState, job: Job, outcome: Outcome) -> None:
    """Commit the outcome of `job`'s attempt (raises StateError if it cannot be written)."""
    end_time = outcome.end_time or time.time()
    fields = {"exit_code": outcome.exit_code, "signal": outcome.signal, "end_time": end_time}
    if cancel_requested(state, job):
        state.transition(job, JobState.CANCELLED, "cancelled by user", **fields)
    elif suspend.suspended_by_exit(state, job, outcome) or oom.requeue_after_oom(
        state, job, outcome
    ):
        pass
    elif outcome.lost_with is not None and requeue_when_lost(state, job):
        copy = incoming.safety_copy(state.node.job_dir(job.id))
        resumes = "" if copy is None else f", from its checkpoint at step {copy['step']} kept here"
        state.transition(
            job,
            JobState.QUEUED,
            f"{outcome.reason}: requeued to run elsewhere{resumes}",
            gpu_uuids=(),
            gpu_mem_reserved=None,
            **fields,
        )
    elif outcome.returncode == 0 and not outcome.time_limit:
        state.transition(job, JobState.SUCCEEDED, outcome.reason or "exited with code 0", **fields)
    else:
        if outcome.time_limit or outcome.start_failed:
            ended, why = JobState.FAILED, outcome.reason
        elif outcome.returncode is None:
            ended, why = JobState.LOST, outcome.reason
        else:
            ended = JobState.FAILED
            sig = f" ({outcome.signal})" if outcome.signal else ""
            why = outcome.reason or f"exited with code {outcome.exit_code}{sig}"
        restarts = state.store.checkpoint_restarts(job.id, job.attempts)
        tries = job.attempts - restarts - oom.requeues(state, job.id)
        if tries <= job.spec.retries:
            delay = retry_delay(tries - 1)
            state.transition(
                job,
                JobState.QUEUED,
                f"{why}; retrying in {format_duration(delay)} "
                f"(attempt {tries + 1} of {job.spec.retries + 1})",
                gpu_uuids=(),
                gpu_mem_reserved=None,
                retry_at=end_time + delay,
                **fields,
            )
        else:
            state.transition(job, ended, why, **fields)
    state.node_of(job.id).control.close(job.id)
    state.gangs.pop(job.id, None)
    state.safety_asked.pop(job.id, None)
    peak = state.memory_peaks.pop(job.id, None)
    if peak:
        try:
            state.store.record_memory_peak(job.spec.name, peak, end_time)
        except StateError as exc:  # only a hint for `--gpu-mem auto`; the outcome is recorded
            log.warning("job %d: memory peak not recorded: %s", job.id, exc)


def requeue_when_lost(state: DaemonState, job: Job) -> bool:
    """True for a job that runs again elsewhere when its server is lost.

    A `gpuq.runner` job always does (its runner made it restartable: it
    resumes from a checkpoint where one is reachable), known by its reports
    or by the safety copy it saved; another only if submitted with
    `--requeue`; else it is lost as its attempt was, and retried only as
    `--retries` allows.
    """
    if job.spec.requeue or job.id in state.latest_samples:
        return True
    copy = incoming.safety_copy(state.node.job_dir(job.id))
    return copy is not None and copy.get("attempt") == job.attempts


def cancel_requested(state: DaemonState, job: Job) -> bool:
    """True if a cancel was asked for during the current attempt."""
    return cancel_requested_at(state, job) is not None


def cancel_requested_at(state: DaemonState, job: Job) -> float | None:
    """When a cancel was first asked for during the current attempt, or None."""
    asked = None
    for event in reversed(state.store.events(job.id)):
        if event.state is JobState.STARTING:
            break
        if event.reason == CANCEL_REQUESTED:
            asked = event.time
    return asked


def request_cancel(state: DaemonState, job: Job) -> Job:
    """Cancel a job: at once if pending, else TERM its group, KILL after grace."""
    if not job.state.is_active or suspend.is_checkpointed(state, job):
        return state.transition(job, JobState.CANCELLED, "cancelled by user", end_time=time.time())
    job = state.transition(job, job.state, CANCEL_REQUESTED)
    _terminate(state, job.id, job.attempts)
    return job


def _terminate(state: DaemonState, job_id: int, attempt: int, kill_at: float | None = None) -> None:
    """TERM the attempt's process group now and KILL it after the grace period.

    A job cancelled the moment it turned running may not have recorded its
    process group yet (the shim does so just after starting the command), so
    this tries again shortly for as long as the attempt is still active.
    `kill_at` (a wall-clock time) ends the grace sooner, for a cancel asked
    for before a daemon restart.
    """
    job = state.active.get(job_id)
    if job is None or not job.state.is_active or job.attempts != attempt:
        return
    loop = asyncio.get_running_loop()
    if not state.node_of(job_id).signal(job_id, signal.SIGTERM):
        loop.call_later(CHILD_POLL_SECONDS, _terminate, state, job_id, attempt, kill_at)
        return
    state.node_of(job_id).signal(job_id, signal.SIGCONT)  # a stopped job must wake to die
    delay = kill_delay(state.config.daemon.kill_grace, kill_at, time.time())
    loop.call_later(delay, _kill, state, job_id, attempt)


def kill_delay(grace: float, kill_at: float | None, now: float) -> float:
    """Seconds from `now` to the KILL: the grace, or less when it must come by `kill_at`."""
    return grace if kill_at is None else min(grace, max(0.0, kill_at - now))


def resume_cancel(state: DaemonState, job: Job) -> None:
    """Carry on a cancel a previous daemon started (its KILL timer died with it).

    The job is sent TERM again (it may not have had it before the crash),
    but the grace counts from the cancel's request: daemons killed over and
    over must not put the KILL off for ever.
    """
    asked = cancel_requested_at(state, job)
    kill_at = None if asked is None else asked + state.config.daemon.kill_grace
    _terminate(state, job.id, job.attempts, kill_at)


def _kill(state: DaemonState, job_id: int, attempt: int) -> None:
    """SIGKILL what is left of the attempt's process group (not a later attempt's)."""
    job = state.active.get(job_id)
    if job is not None and job.attempts == attempt:
        state.node_of(job_id).signal(job_id, signal.SIGKILL)


def check_runnable_command(command: tuple[str, ...], cwd: str, path_env: str | None) -> None:
    """Reject a missing cwd or a command that cannot be found, with a hint."""
    if not os.path.isdir(cwd):
        if os.path.exists(cwd):
            raise UsageError(
                f"working directory {cwd!r} is not a directory", "pass a directory as --cwd"
            )
        raise UsageError(f"working directory {cwd!r} does not exist", "pass an existing --cwd")
    program = command[0]
    if "/" in program:
        target = Path(cwd, program)
        if not target.is_file():
            raise UsageError(
                f"no such file: {program!r} (relative to {cwd})",
                "check the path, or pass --cwd DIR for a path relative to another directory",
            )
        if not os.access(target, os.X_OK):
            raise UsageError(
                f"{program!r} is not executable",
                f"chmod +x {program}, or run it via its interpreter",
            )
        return
    if shutil.which(program, path=path_env) is None:
        raise UsageError(f"command not found: {program!r}", "check the spelling and the job's PATH")
