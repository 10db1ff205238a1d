"""Safety copies: a job running on another server keeps a recent checkpoint at the head.

A server can be lost with everything on its disk, the checkpoints of the
jobs it ran included. Every `cluster.checkpoint_every`, `tick` asks each
`gpuq.runner` job running on another server to save a checkpoint and go
on (`CheckpointRequest`). When its runner says it saved one at step N (its
``checkpoint`` acknowledgement, `saved`), the head pulls that one file into
the job's own directory here: rsync over gpuq's shared ssh connection into
``checkpoints.safety``, with a record of the step, the server and the
attempt (``suspended.json``, mode ``copy``), its SHA-256 checked against the
file's header, and only then renamed into place as the job's
``checkpoints``. When the server is lost and the job requeued,
`transfer.checkpoint_source` finds that copy: the job resumes from it here,
or on a third server after the usual copy phase.

A copy is put in place only while the attempt it came from still runs
there: one that arrives after the job was lost, moved, suspended or ended
is dropped (a newer checkpoint may have taken its place), and a pull cut
off midway, or a damaged file, replaces nothing. Multi-node jobs are not
copied (each part's server keeps its own checkpoints).
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

from gpuq import ckptfile
from gpuq.control import ACK_FILE, CheckpointRequest
from gpuq.daemon import incoming, jobfiles, transfer
from gpuq.daemon.state import DaemonState
from gpuq.errors import GpuqError, StateError
from gpuq.models import Job, JobState
from gpuq.units import format_size

log = logging.getLogger("gpuq.daemon")


def tick(state: DaemonState, now: float) -> list[int]:
    """Ask each runner job on another server that is due for a safety checkpoint; their ids."""
    every = state.config.cluster.checkpoint_every
    if every <= 0:
        return []
    asked = []
    for job in list(state.active.values()):
        remote = state.remotes.get(job.node)
        if job.state is not JobState.RUNNING or remote is None or job.id in state.gangs:
            continue
        runner = remote.control.runner(job.id)
        if job.id in state.safety_pulls or runner is None or "checkpoint" not in runner.features:
            continue
        if now - _last(state, job) < every:
            continue
        if remote.control.send(job.id, CheckpointRequest()):
            state.safety_asked[job.id] = (job.attempts, now)
            asked.append(job.id)
    return asked


def _last(state: DaemonState, job: Job) -> float:
    """When the job's current attempt last saved a safety checkpoint (or started)."""
    attempt, at = state.safety_asked.get(job.id, (0, 0.0))
    if attempt == job.attempts:
        return at
    last = job.start_time or time.time()
    record = incoming.safety_copy(state.node.job_dir(job.id))  # after a restart of this daemon
    if record is not None and record.get("attempt") == job.attempts:
        last = max(float(record.get("time") or 0.0), last)
    state.safety_asked[job.id] = (job.attempts, last)  # read once per attempt
    return last


def saved(state: DaemonState, job: Job, step: object) -> bool:
    """The job's runner saved a checkpoint on request: pull it here if it runs elsewhere.

    True when the copy is under way (its end is the event that tells of the
    save), False when this job's checkpoint is not one to copy.
    """
    remote = state.remotes.get(job.node)
    if remote is None or job.id in state.gangs or job.id in state.safety_pulls:
        return False
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return False
    state.safety_pulls.add(job.id)
    state.safety_asked[job.id] = (job.attempts, time.time())
    job_id, attempt, node = job.id, job.attempts, job.node

    async def run() -> None:
        try:
            copied = await pull(state, job_id, attempt, node, step)
        except GpuqError as exc:
            log.warning("job %d: no safety copy of step %d from %s: %s", job_id, step, node, exc)
            current = state.active.get(job_id)
            if current is not None and current.attempts == attempt:
                state.transition(
                    current,
                    current.state,
                    f"its checkpoint at step {step} could not be copied here from {node}: "
                    f"{exc.message}; the last copy is kept",
                )
            return
        finally:
            state.safety_pulls.discard(job_id)
        current = state.active.get(job_id)
        if copied is not None and current is not None:
            size, seconds = copied
            state.transition(
                current,
                current.state,
                f"checkpoint saved at step {step} on request and copied here from {node} "
                f"({format_size(size)} in {seconds:.2f}s, verified): it resumes from it "
                f"if {node} is lost",
            )

    task = asyncio.get_running_loop().create_task(run())
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    return True


def refused(state: DaemonState, job: Job, error: str) -> bool:
    """The job refused a checkpoint; True if it was a safety one: this attempt is asked no more.

    A script without a `gpuq.runner.State` has nothing to save, and would
    refuse every period; it is said once, in the event log.
    """
    asked = state.safety_asked.get(job.id)
    if asked is None or asked[0] != job.attempts or job.node not in state.remotes:
        return False
    state.safety_asked[job.id] = (job.attempts, math.inf)
    state.transition(
        job,
        job.state,
        f"it refused a safety checkpoint ({error}): no copy is kept here, and if "
        f"{job.node} is lost it starts over",
    )
    return True


async def pull(
    state: DaemonState, job_id: int, attempt: int, node: str, step: int
) -> tuple[int, float] | None:
    """Copy ``ckpt-<step>.pt`` of the job from `node` here; (bytes, seconds), None if superseded.

    StateError when the copy fails or the file is unsound; nothing is
    replaced then.
    """
    started = time.perf_counter()
    remote = state.remotes[node]
    job_dir = state.node.job_dir(job_id)
    arrived = await asyncio.to_thread(incoming.prepare, job_dir, incoming.SAFETY)
    try:
        source = remote.job_dir(job_id) / jobfiles.CHECKPOINTS / f"ckpt-{step}.pt"
        await transfer.rsync(state, f"{node}:{source}", str(arrived), one_file=True)
        record: dict[str, Any] = {
            "mode": "copy",
            "job_id": job_id,
            "attempt": attempt,
            "step": step,
            "from": node,
            "time": time.time(),
        }
        problems = await asyncio.to_thread(_record_and_check, arrived, record)
        if problems:
            raise StateError(f"the copy is unsound: {'; '.join(problems)}", "the last copy is kept")
        current = state.active.get(job_id)
        if (
            current is None
            or current.attempts != attempt
            or current.node != node
            or current.state is not JobState.RUNNING
        ):
            return None  # lost, moved, suspended or ended meanwhile: a newer checkpoint may rule
        result = incoming.commit(job_dir, checked=True, arrived=incoming.SAFETY)
    finally:
        shutil.rmtree(arrived, ignore_errors=True)
    return int(result["bytes"]), time.perf_counter() - started


def _record_and_check(arrived: Path, record: dict[str, Any]) -> list[str]:
    """Write the copy's record beside it; what is wrong with the copy (SHA-256 against headers)."""
    jobfiles.write_json(arrived / ACK_FILE, record, durable=True)
    return ckptfile.verify_dir(arrived)
