"""A job that dies of CUDA out-of-memory while packed: requeued, not failed (Gandiva).

Packing two jobs on one GPU trusts their measured memory peaks; a job whose
memory grows past what its partner left it dies of out-of-memory. That is
the packing's fault, not the job's, so when an attempt ends `lifecycle`
asks `requeue_after_oom` first. The proof is the runner's record
(`gpuq.runner.oom`, ``out-of-memory.json``) naming the job and this attempt,
with a failing exit that was not a time limit. If the job was packed at the
time (`PackBook.of`), one commit of the book:

- remembers the pair (`PackBook.failed`): the view gives it to the policy
  (`JobView.oom_partners`), which never packs the two together again;
- raises the job's memory need (`raised_memory`) above what it had beside
  its partner, and the learned memory of jobs of its name (`--gpu-mem auto`);
- drops the pack, and counts the attempt as an out-of-memory requeue
  (`PackBook.oom_requeues`: not a retry, see `requeues`);

then the job goes back to the queue with the reason, and its partner, which
runs on alone, is told why it was unpacked. The requeued attempt is looked
up again after a daemon killed in between, so the requeue is finished, not
mistaken for a failure. A job that runs out of memory when not packed
fails as any other (its retries apply).
"""

from __future__ import annotations

import logging
import math
import time

from gpuq.control import OOM_FILE
from gpuq.daemon import jobfiles
from gpuq.daemon.executor import Outcome
from gpuq.daemon.scheduler import memory
from gpuq.daemon.state import DaemonState
from gpuq.errors import StateError
from gpuq.models import Job, JobState
from gpuq.units import format_size

log = logging.getLogger("gpuq.daemon")

MIB = 1024**2


def raised_memory(known: int, usable: int, partner: int, margin: float) -> int:
    """The memory need of a job that ran out beside a partner holding `partner` bytes.

    It needed more than the `usable - partner` bytes it had, and more than it
    was known to need: the larger of the two, a margin above what was known,
    rounded up to a MiB.
    """
    had = max(0, usable - partner)
    need = max(int(known * (1 + margin)), had + 1)
    return math.ceil(need / MIB) * MIB


def requeues(state: DaemonState, job_id: int) -> int:
    """How many of the job's attempts were requeued after running out of memory packed."""
    return len(state.packs.oom_requeues.get(job_id, ()))


def _known_need(state: DaemonState, job: Job) -> int:
    """The most GPU memory the daemon knew the job to need, per GPU (0 if nothing)."""
    sample = state.latest_samples.get(job.id, {})
    reported = sample.get("memory_peak_bytes")
    known = [
        state.introspection.memory(job.id),
        state.memory_peaks.get(job.id, 0),
        state.packs.raised.get(job.id, 0),
        job.gpu_mem_reserved or 0,
        reported if isinstance(reported, int) else 0,
    ]
    return max(known)


def _usable(state: DaemonState, job: Job) -> int:
    """The memory a job may use on its tightest GPU, margin and foreign memory taken off."""
    margin = state.config.scheduler.memory_margin
    sizes = [
        int(gpu.memory_total * (1 - margin)) - state.gpus.foreign_memory.get(gpu.uuid, 0)
        for gpu in state.gpus.devices
        if gpu.uuid in job.gpu_uuids
    ]
    return min(sizes, default=0)


def requeue_after_oom(state: DaemonState, job: Job, outcome: Outcome) -> bool:
    """Requeue a job that ran out of GPU memory while packed (module docstring); else False."""
    if outcome.returncode in (None, 0) or outcome.time_limit or outcome.start_failed:
        return False
    record = state.node_of(job.id).read_record(job.id, f"{jobfiles.CHECKPOINTS}/{OOM_FILE}")
    if not record or record.get("job_id") != job.id or record.get("attempt") != job.attempts:
        return False
    book = state.packs
    pack = book.of(job.id)
    done = job.attempts in book.oom_requeues.get(job.id, ())
    if pack is None and not done:
        return False
    error = str(record.get("error") or "CUDA out of memory")
    partner = None if pack is None else pack.partner(job.id)
    if pack is not None and partner is not None:
        mate = state.active.get(partner)
        known = _known_need(state, job)
        beside = 0 if mate is None else _known_need(state, mate)
        margin = state.config.scheduler.auto_mem_margin
        raised = raised_memory(known, _usable(state, job), beside, margin)
        book.failed.add(frozenset((job.id, partner)))
        book.raised[job.id] = max(raised, book.raised.get(job.id, 0))
        book.oom_requeues[job.id] = (*book.oom_requeues.get(job.id, ()), job.attempts)
        book.drop(pack)
        memory.commit_packs(state)  # StateError: the outcome is recorded again later
        now = time.time()
        try:
            state.store.record_memory_peak(job.spec.name, book.raised[job.id], now)
        except StateError as exc:  # only a hint for `--gpu-mem auto`
            log.warning("job %d: raised memory not learned: %s", job.id, exc)
        why = (
            f"ran out of GPU memory packed with job {partner} ({error}): requeued, not as a "
            f"retry; memory need raised {format_size(known)} -> {format_size(raised)}; "
            f"never packed with job {partner} again"
        )
        if mate is not None and mate.state.is_active:
            state.transition(
                mate, mate.state, f"unpacked from job {job.id}: it ran out of GPU memory beside it"
            )
    else:
        why = f"ran out of GPU memory packed ({error}): requeued, not as a retry"
    state.transition(
        job,
        JobState.QUEUED,
        why,
        gpu_uuids=(),
        gpu_mem_reserved=None,
        exit_code=outcome.exit_code,
        signal=outcome.signal,
        end_time=outcome.end_time or time.time(),
    )
    return True
