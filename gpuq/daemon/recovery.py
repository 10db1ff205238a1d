"""Crash recovery: the one function that reconciles the store with reality.

Run once at daemon start, before any request is served. For every job the
store says may have a process (starting, running, suspending, suspended):

0. a job suspended to a checkpoint has no process by design: nothing to do;
1. a live shim holds the job's lock: re-adopt it (watch its pid, re-create
   its control socket, for which the runner reconnects by itself; finish a
   half-done stop-mode suspend, or keep waiting for a checkpoint or park);
2. no live shim, but the shim of the current attempt wrote `exit.json`:
   record the true outcome (exit code, signal), applying retries as usual;
3. no shim (or no launch of the current attempt yet: a start cut while its
   checkpoint was being copied) while `starting`: the daemon died before the
   job ran, so it goes back to the queue (no attempt is counted). An
   earlier attempt's exit record is never taken for the current one's;
4. otherwise the job's shim is gone without a record (killed while the
   daemon was down): kill whatever is left of the attempt (its process
   group and every process carrying its environment, verified by start
   time and boot id: `Executor.kill_leftovers`), then mark it `lost` with
   the reason, and requeue it if it has retries left. The kill comes first,
   so neither its GPUs nor a retry are handed out while it still runs.

Queued and held jobs need nothing: they are only rows. Because the shim holds
the job lock from before the command starts until after `exit.json` is
written, a job is never started twice: case 3 can only happen when no shim
exists.
"""

from __future__ import annotations

import time

from gpuq.daemon import jobfiles, lifecycle, suspend
from gpuq.daemon.executor import Outcome
from gpuq.daemon.node.gang import GangNode, Part
from gpuq.daemon.state import DaemonState
from gpuq.models import Job, JobState


def recover(state: DaemonState) -> dict[str, int]:
    """Reconcile every job that may have had a process; returns counts."""
    counts = {"adopted": 0, "finished": 0, "requeued": 0, "lost": 0}
    for job in sorted(state.active.values(), key=lambda j: j.id):
        if not job.state.is_active or suspend.is_checkpointed(state, job):
            continue
        if job.spec.multi_node and job.node:
            counts[_adopt_parts(state, job)] += 1
            continue
        if job.node and job.node != state.config.daemon.node_name:
            counts["remote"] = counts.get("remote", 0) + _adopt_remote(state, job)
            continue
        try:
            pid = state.node.live_shim(job.id)
        except RuntimeError as exc:  # a shim whose record is unreadable: it cannot be re-adopted
            survivors = state.node.kill_leftovers(job.id)  # nor left to run on GPUs given away
            reason = f"{exc}; its processes were killed"
            if survivors:
                reason = f"{exc}; processes {survivors} of the job could not be killed"
            state.transition(job, JobState.LOST, reason, end_time=time.time())
            counts["lost"] += 1
            continue
        if pid is not None:
            if job.state is JobState.STARTING:
                job = state.transition(
                    job, JobState.RUNNING, "re-adopted after daemon restart", start_time=time.time()
                )
            elif job.state is JobState.SUSPENDING:
                job = suspend.readopt(state, job)
            else:
                state.store.transition(
                    job, job.state, "re-adopted after daemon restart", time.time()
                )
                if job.state is JobState.RUNNING:
                    suspend.continue_readopted(state, job)
            state.node.control.open(job.id)
            lifecycle.watch(state, job.id, pid)
            if lifecycle.cancel_requested(state, job):
                lifecycle.resume_cancel(state, job)
            counts["adopted"] += 1
        elif launched(state, job) and state.node.has_exit_record(job.id):
            lifecycle.finish(state, job.id, state.node.outcome(job.id))
            counts["finished"] += 1
        elif job.state is JobState.STARTING and (
            not launched(state, job) or not state.node.has_shim_record(job.id)
        ):
            state.transition(
                job,
                JobState.QUEUED,
                "requeued: the daemon stopped before the job started",
                attempts=max(0, job.attempts - 1),
                gpu_uuids=(),
                gpu_mem_reserved=None,
            )
            counts["requeued"] += 1
        else:
            survivors = state.node.kill_leftovers(job.id)
            reason = "the job's shim ended while the daemon was down, without a record"
            if survivors:
                reason += f"; processes {survivors} of the job could not be killed"
            lifecycle.finish(state, job.id, Outcome(None, None, reason, None))
            counts["lost"] += 1
    return counts


def launched(state: DaemonState, job: Job) -> bool:
    """True once the job's current attempt was handed to its shim (its launch record is there).

    The records of an earlier attempt (its exit status above all) stay until
    the next launch replaces them: a job whose start was cut before its
    launch (its checkpoint being copied) must not take them for its own.
    """
    record = state.node.read_record(job.id, jobfiles.LAUNCH)
    return jobfiles.launch_attempt(record) == job.attempts


def _adopt_parts(state: DaemonState, job: Job) -> str:
    """Re-adopt a multi-node job's parts, each where it runs (`GangNode.adopt`).

    A job cut while its parts were starting goes back to the queue, what
    started of it killed (the other servers stop attempts the head no
    longer expects); one with a part on a server no longer configured is
    lost. Returns the count it adds to: adopted, requeued or lost.
    """
    here = state.config.daemon.node_name
    gone = [name for name in job.part_nodes if name != here and name not in state.remotes]
    if gone or job.state is JobState.STARTING:
        state.node.kill_leftovers(job.id)
    if gone:
        why = f"its server {gone[0]} is no longer configured"
        lifecycle.finish(state, job.id, Outcome(None, None, why, None))
        return "lost"
    if job.state is JobState.STARTING:
        state.transition(
            job,
            JobState.QUEUED,
            "requeued: the daemon stopped while the job's parts were starting",
            attempts=max(0, job.attempts - 1),
            gpu_uuids=(),
            gpu_mem_reserved=None,
        )
        return "requeued"
    parts = [Part(state.node_named(name), rank, ()) for rank, name in enumerate(job.part_nodes)]
    gang = GangNode(
        parts, "", lambda name, rank: ("", "", {}), lambda: state.config.daemon.kill_grace
    )
    state.gangs[job.id] = gang
    if job.state is JobState.SUSPENDING:
        job = suspend.readopt(state, job)
    else:
        state.store.transition(job, job.state, "re-adopted after daemon restart", time.time())
    gang.adopt(
        job.id, lambda job_id, outcome: lifecycle.finish(state, job_id, outcome), job.attempts
    )
    if lifecycle.cancel_requested(state, job):
        lifecycle.resume_cancel(state, job)
    return "adopted"


def _adopt_remote(state: DaemonState, job: Job) -> int:
    """Leave an attempt on another server to that server's node: its next sync tells.

    Running there: it is watched as before (a starting one turns running);
    ended: its outcome is recorded; never started (the head stopped
    mid-placement): the job goes back to the queue, no attempt counted.
    A job on a server no longer configured is lost. Returns 1 if adopted.
    """
    remote = state.remotes.get(job.node)
    if remote is None:
        lifecycle.finish(
            state,
            job.id,
            Outcome(None, None, f"its server {job.node} is no longer configured", None),
        )
        return 0

    def running(job_id: int) -> None:
        current = state.active.get(job_id)
        if current is not None and current.state is JobState.STARTING:
            state.transition(
                current, JobState.RUNNING, "re-adopted after daemon restart", start_time=time.time()
            )

    def missing(job_id: int, outcome: Outcome) -> None:
        current = state.active.get(job_id)
        if current is not None and current.state is JobState.STARTING:
            state.transition(
                current,
                JobState.QUEUED,
                f"requeued: the daemon stopped before the job started on {job.node}",
                attempts=max(0, current.attempts - 1),
                gpu_uuids=(),
                gpu_mem_reserved=None,
            )
        else:
            lifecycle.finish(state, job_id, outcome)

    remote.adopt(
        job.id,
        job.attempts,
        lambda job_id, outcome: lifecycle.finish(state, job_id, outcome),
        running,
        missing,
    )
    if lifecycle.cancel_requested(state, job):
        lifecycle.resume_cancel(state, job)
    return 1
