"""Suspend and resume in their three modes, and what runners report about them.

- **stop** (any job): SIGSTOP of the job's process group, after the
  `--signal` warning if the job asked for one. It keeps its GPUs and memory;
  resume is SIGCONT.
- **checkpoint** (a job whose `gpuq.runner` is connected): the intent is
  committed first (the mode in `job_suspends`, the job `suspending`), then a
  `SuspendRequest` goes over the control channel. The runner saves at its
  next iteration boundary, acknowledges and exits with `SUSPEND_EXIT_CODE`,
  leaving `ACK_FILE` in its checkpoint directory; `suspended_by_exit` then
  records the job `suspended` and frees its GPUs. The acknowledgement,
  which comes before the exit, completes the suspend: the state is safe, and
  the time-slicer may give the GPUs to the next job while the process
  exits. Resume puts it back in the queue; the next attempt restores the
  checkpoint.
- **park** (runner jobs): the runner moves its state to host memory at the
  next boundary and acknowledges; the job is `suspended` and keeps its GPUs.
  Resume sends `ResumeRequest` (and SIGCONT, which also ends a park, for a
  runner that is reconnecting).

**Preemption** by the scheduler (`preempt`) is a checkpoint-mode suspend
with purpose "policy", its reason recorded with the intent: once the
checkpoint is saved the job goes straight back to the queue (not
`suspended`), to restart from it wherever the policy places it next. Only a
job whose runner can checkpoint is preempted; a crash in between is finished
(the exit is collected as any other) or undone (no boundary in time: the
request is withdrawn and the job keeps running), each with its reason.

**Turns** (time-slicing, `gpuq.daemon.scheduler.slicer`): `take_turn`
parks a runner job or stops a plain one, with purpose "slice" and the
reason ("quantum ended, job 12's turn") committed first; `give_turn`
commits the job running again, then resumes it on the GPUs it kept. A
daemon killed between the two halves of a `give_turn` resumes the job
when it re-adopts it (SIGCONT, and the runner's `ResumeRequest` when it
says hello again), so a job the store calls running never stays parked.

`auto` is checkpoint when a runner is connected, else stop. A checkpoint or
park request that no iteration boundary honours within `BOUNDARY_GRACE`
seconds is withdrawn (a `ResumeRequest`) and the job is left running, with
the reason in the event log. A runner job that exits with the suspend code
and a valid acknowledgement without being asked (a SIGUSR1 from its user)
is recorded as suspended in checkpoint mode as well.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any, Final

from gpuq.control import (
    ACK_FILE,
    SUSPEND_EXIT_CODE,
    Ack,
    Hello,
    Metrics,
    ResumeRequest,
    SuspendRequest,
    sample_to_dict,
)
from gpuq.daemon import faults, jobfiles, safety
from gpuq.daemon.executor import Outcome
from gpuq.daemon.scheduler import typed
from gpuq.daemon.scheduler.view import new_model
from gpuq.daemon.state import DaemonState
from gpuq.daemon.store import SuspendRecord
from gpuq.errors import ConflictError, UsageError
from gpuq.models import Job, JobState
from gpuq.protocol import SUSPEND_MODES
from gpuq.units import format_size

log = logging.getLogger("gpuq.daemon")

BOUNDARY_GRACE: Final = 120.0
"""Seconds a runner has to reach an iteration boundary for a checkpoint or park."""
CHILD_POLL_SECONDS: Final = 0.05
"""How often a stop looks again for the process group of a job just started."""
RUNNER_MODES: Final = ("checkpoint", "park")


def request(state: DaemonState, job: Job, mode: str) -> Job:
    """Suspend a running job in `mode` (see the module docstring)."""
    if mode not in SUSPEND_MODES:
        raise UsageError(f"unknown suspend mode {mode!r}", f"modes: {', '.join(SUSPEND_MODES)}")
    runner = state.node_of(job.id).control.runner(job.id)
    if mode == "auto":
        mode = "checkpoint" if runner is not None and "checkpoint" in runner.features else "stop"
    if mode == "stop":
        return _request_stop(state, job)
    if runner is None or mode not in runner.features:
        raise ConflictError(
            f"cannot suspend job {job.id} in {mode} mode: its gpuq.runner is not connected",
            "a plain job suspends with --mode stop (SIGSTOP)",
        )
    now = time.time()
    state.store.record_suspend(job.id, job.attempts, mode, now)
    job = state.transition(job, JobState.SUSPENDING, f"suspend requested ({mode} mode)")
    state.node_of(job.id).control.send(job.id, SuspendRequest(mode))
    _arm_grace(state, job, now)
    return job


def can_preempt(state: DaemonState, job: Job) -> bool:
    """True when the scheduler may take the job's GPUs: running, with a checkpointing runner."""
    runner = state.node_of(job.id).control.runner(job.id)
    return job.state is JobState.RUNNING and runner is not None and "checkpoint" in runner.features


def preempting(state: DaemonState, job: Job) -> bool:
    """True while the scheduler's own preemption of the job is under way (a checkpoint).

    The job leaves its GPUs and goes back to the queue whatever the policy
    decides now, so the policy may size it as it would a preemptible job:
    kept at what it holds, it would keep GPUs that another job resized at
    the same time was meant to take.
    """
    if job.state is not JobState.SUSPENDING:
        return False
    record = state.store.suspend_of(job.id, job.attempts)
    return record is not None and record.purpose == "policy" and record.mode == "checkpoint"


def preempt(
    state: DaemonState, job: Job, reason: str, crash_point: str = "preempt-committed"
) -> Job:
    """Checkpoint the job for the scheduler, which queues it again once saved (docstring).

    `crash_point` names the fault point between the intent and the request.
    """
    if not can_preempt(state, job):
        raise ConflictError(
            f"cannot preempt job {job.id}: only a running job whose gpuq.runner checkpoints can be",
            "jobs without the runner keep their GPUs until they end",
        )
    now = time.time()
    state.store.record_suspend(job.id, job.attempts, "checkpoint", now, "policy", reason)
    job = state.transition(job, JobState.SUSPENDING, f"{reason} (checkpoint requested)")
    faults.crash_point(crash_point)
    state.node_of(job.id).control.send(job.id, SuspendRequest("checkpoint"))
    _arm_grace(state, job, now)
    return job


def take_turn(state: DaemonState, job: Job, mode: str, reason: str) -> Job:
    """Park (runner) or stop a running job so another takes its turn (module docstring)."""
    if mode not in ("park", "stop"):
        raise UsageError(f"a turn ends by park or stop, not {mode!r}")
    now = time.time()
    state.store.record_suspend(job.id, job.attempts, mode, now, "slice", reason)
    job = state.transition(job, JobState.SUSPENDING, f"{reason} ({mode} requested)")
    faults.crash_point("turn-committed")
    if mode == "stop":
        return complete_stop(state, job.id) or job
    state.node_of(job.id).control.send(job.id, SuspendRequest("park"))
    _arm_grace(state, job, now)
    return job


def give_turn(state: DaemonState, job: Job, reason: str) -> Job:
    """Resume a job parked or stopped for another's turn, on the GPUs it kept."""
    mode = mode_of(state, job)
    job = state.transition(job, JobState.RUNNING, reason)
    faults.crash_point("resume-committed")
    if mode == "park":
        state.node_of(job.id).control.send(job.id, ResumeRequest())
    state.node_of(job.id).signal(job.id, signal.SIGCONT)
    return job


def continue_readopted(state: DaemonState, job: Job) -> None:
    """Make sure a re-adopted running job computes: its resume may have died with a daemon."""
    record = state.store.suspend_of(job.id, job.attempts)
    if record is not None and record.completed is not None and record.mode in ("park", "stop"):
        state.node_of(job.id).signal(
            job.id, signal.SIGCONT
        )  # the park's ResumeRequest follows its hello


def _turn_reason(record: SuspendRecord | None) -> str:
    """The turn's reason, to open the suspended job's event ("quantum ended, ...: ")."""
    if record is not None and record.purpose == "slice" and record.reason:
        return f"{record.reason}: "
    return ""


def _arm_grace(state: DaemonState, job: Job, requested: float) -> None:
    delay = max(0.0, requested + BOUNDARY_GRACE - time.time())
    asyncio.get_running_loop().call_later(delay, _give_up, state, job.id, job.attempts, requested)


def _give_up(state: DaemonState, job_id: int, attempt: int, requested: float) -> None:
    """Withdraw a checkpoint or park request the job has not honoured in time."""
    job = state.active.get(job_id)
    record = state.store.suspend_of(job_id, attempt)
    if job is None or job.attempts != attempt or job.state is not JobState.SUSPENDING:
        return
    if record is None or record.requested != requested or record.completed is not None:
        return
    state.node_of(job_id).control.send(job_id, ResumeRequest())
    state.transition(
        job,
        JobState.RUNNING,
        f"suspend ({record.mode} mode) withdrawn: no iteration boundary within "
        f"{BOUNDARY_GRACE:g}s; the job keeps running",
    )


def _request_stop(state: DaemonState, job: Job) -> Job:
    """Stop mode: SIGSTOP of the process group, after the `--signal` warning if any."""
    state.store.record_suspend(job.id, job.attempts, "stop", time.time())
    job = state.transition(job, JobState.SUSPENDING, "suspend requested (stop mode)")
    warning = job.spec.signal
    if warning is None:
        return complete_stop(state, job.id) or job
    _warn(state, job.id, job.attempts, warning.signal)
    asyncio.get_running_loop().call_later(warning.seconds, complete_stop, state, job.id)
    return job


def _warn(state: DaemonState, job_id: int, attempt: int, signum: int) -> None:
    """Send the `--signal` warning; a job that just started may not have its group yet."""
    job = state.active.get(job_id)
    if job is None or job.attempts != attempt or job.state is not JobState.SUSPENDING:
        return
    if not state.node_of(job_id).signal(job_id, signum):
        loop = asyncio.get_running_loop()
        loop.call_later(CHILD_POLL_SECONDS, _warn, state, job_id, attempt, signum)


def complete_stop(state: DaemonState, job_id: int) -> Job | None:
    """Stop the job if a stop-mode suspend is still pending for it.

    A job suspended the moment it turned running may not have recorded its
    process group yet: then this tries again shortly, and the job stays
    `suspending` until it is really stopped.
    """
    job = state.active.get(job_id)
    if job is None or job.state is not JobState.SUSPENDING:
        return None
    if not state.node_of(job_id).signal(job_id, signal.SIGSTOP):
        asyncio.get_running_loop().call_later(CHILD_POLL_SECONDS, complete_stop, state, job_id)
        return None
    state.store.complete_suspend(job_id, job.attempts, time.time())
    why = _turn_reason(state.store.suspend_of(job_id, job.attempts))
    return state.transition(job, JobState.SUSPENDED, f"{why}suspended (stop mode)")


def mode_of(state: DaemonState, job: Job) -> str:
    """The mode of the job's current suspend: stop unless a runner mode was asked."""
    record = state.store.suspend_of(job.id, job.attempts)
    return "stop" if record is None else record.mode


def is_checkpointed(state: DaemonState, job: Job) -> bool:
    """True for a job suspended to a checkpoint: it has no process and holds no GPU."""
    if job.state is not JobState.SUSPENDED:
        return False
    record = state.store.suspend_of(job.id, job.attempts)
    return record is not None and record.mode == "checkpoint" and record.completed is not None


def resume(state: DaemonState, job: Job) -> Job:
    """Resume a suspended (or still suspending) job in the way its mode needs."""
    mode = mode_of(state, job)
    if is_checkpointed(state, job):
        return state.transition(
            job,
            JobState.QUEUED,
            "resumed by user: queued to restart from its checkpoint",
            gpu_uuids=(),
            gpu_mem_reserved=None,
            exit_code=None,
        )
    if mode in RUNNER_MODES:
        state.node_of(job.id).control.send(job.id, ResumeRequest())
        state.node_of(job.id).signal(job.id, signal.SIGCONT)  # also ends a park, channel or not
        why = f"resumed by user ({mode} mode)"
        if job.state is JobState.SUSPENDING:
            why = f"resumed by user: the {mode} request is withdrawn"
        return state.transition(job, JobState.RUNNING, why)
    state.node_of(job.id).signal(job.id, signal.SIGCONT)
    return state.transition(job, JobState.RUNNING, "resumed by user")


def readopt(state: DaemonState, job: Job) -> Job:
    """Finish or keep waiting for the suspend of a job re-adopted after a restart."""
    record = state.store.suspend_of(job.id, job.attempts)
    if record is None or record.mode not in RUNNER_MODES:
        state.node_of(job.id).signal(job.id, signal.SIGSTOP)
        state.store.complete_suspend(job.id, job.attempts, time.time())
        return state.transition(job, JobState.SUSPENDED, "suspended (stop mode)")
    _arm_grace(state, job, record.requested)  # the request is sent again at the runner's hello
    return state.transition(
        job, job.state, f"re-adopted after daemon restart; waiting for the {record.mode} suspend"
    )


def suspended_by_exit(state: DaemonState, job: Job, outcome: Outcome) -> bool:
    """Record a runner's checkpoint-mode exit as `suspended`; False if it was not one.

    The proof is the exit status `SUSPEND_EXIT_CODE` together with an
    acknowledgement file naming this job and attempt; a time-limit kill
    (the shim's reason is set) is never a suspend.
    """
    if outcome.returncode != SUSPEND_EXIT_CODE or outcome.reason:
        return False
    ack = state.node_of(job.id).read_record(job.id, f"{jobfiles.CHECKPOINTS}/{ACK_FILE}")
    if ack is None or ack.get("mode") != "checkpoint":
        return False
    if ack.get("job_id") != job.id or ack.get("attempt") != job.attempts:
        return False
    now = time.time()
    record = state.store.suspend_of(job.id, job.attempts)
    if record is None or record.mode != "checkpoint":
        state.store.record_suspend(job.id, job.attempts, "checkpoint", now)
    state.store.complete_suspend(job.id, job.attempts, now)
    if record is not None and record.mode == "checkpoint" and record.purpose == "policy":
        state.transition(
            job,
            JobState.QUEUED,
            f"{record.reason}: checkpoint saved at step {ack.get('step')} ({_cost(ack)}); "
            "queued to restart from it",
            gpu_uuids=(),
            gpu_mem_reserved=None,
            exit_code=None,
            signal=None,
        )
        return True
    state.transition(
        job,
        JobState.SUSPENDED,
        f"suspended (checkpoint mode) at step {ack.get('step')}: {_cost(ack)}; GPUs freed",
        gpu_uuids=(),
        gpu_mem_reserved=None,
        exit_code=outcome.exit_code,
        signal=None,
    )
    return True


def _cost(detail: dict[str, Any]) -> str:
    """`12.0M in 0.08s`, from an acknowledgement's bytes and seconds."""
    size, seconds = detail.get("bytes"), detail.get("seconds")
    text = format_size(size) if isinstance(size, int) and size >= 0 else "?"
    if isinstance(seconds, int | float):
        text += f" in {seconds:.2f}s"
    return text


class ChannelListener:
    """Turns what runners say on their control channels into store rows and transitions."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state

    def on_hello(self, job_id: int, hello: Hello) -> None:
        """Send a pending checkpoint or park request again (it may have died with a daemon)."""
        job = self.state.active.get(job_id)
        if job is None:
            return
        if hello.attempt != job.attempts:
            log.warning(
                "job %d: runner of attempt %d, expected %d", job_id, hello.attempt, job.attempts
            )
        record = self.state.store.suspend_of(job_id, job.attempts)
        if record is not None and record.mode == "park" and job.state is JobState.RUNNING:
            self.state.node_of(job_id).control.send(job_id, ResumeRequest())  # lost in a crash
            return
        if record is None or record.completed is not None or record.mode not in RUNNER_MODES:
            return
        if job.state is JobState.SUSPENDING:
            self.state.node_of(job_id).control.send(job_id, SuspendRequest(record.mode))

    def on_message(self, job_id: int, message: Metrics | Ack) -> None:
        """Store and publish a metrics sample, or act on an acknowledgement."""
        job = self.state.active.get(job_id)
        if job is None:
            return
        if isinstance(message, Metrics):
            sample = sample_to_dict(message.sample)
            sample["gpus"] = len(job.gpu_uuids)  # what it ran on when it measured this
            if kinds := self.state.gpu_types(job.gpu_uuids):
                sample["gpu_type"] = kinds
                typed.record(self.state.type_fits.setdefault(job_id, {}), sample)
            self.state.store.add_sample(job_id, job.attempts, sample)
            previous = self.state.latest_samples.get(job_id, {})
            self.state.latest_samples[job_id] = sample
            if new_model(previous, sample) and self.state.policy.capabilities.adaptive_jobs:
                self.state.wake.set()  # a goodput policy decides from the new model now
            profiled = self.state.profiled_gpus.get(job_id, 0)
            self.state.profiled_gpus[job_id] = max(profiled, sample["gpus"])
            self.state.publish({"type": "metrics", "job": job_id, "sample": sample})
        else:
            self._on_ack(job, message)

    def _on_ack(self, job: Job, ack: Ack) -> None:
        state, detail = self.state, ack.detail
        record = state.store.suspend_of(job.id, job.attempts)
        pending = (
            job.state is JobState.SUSPENDING and record is not None and record.completed is None
        )
        if not ack.ok:
            error = detail.get("error", "no reason given")
            if ack.request == "checkpoint" and safety.refused(state, job, str(error)):
                return
            if ack.request == "suspend" and pending:
                state.transition(job, JobState.RUNNING, f"the job refused to suspend: {error}")
            else:
                state.transition(job, job.state, f"the job refused a {ack.request}: {error}")
            return
        if ack.request == "suspend" and detail.get("mode") == "checkpoint":
            if pending and record is not None and record.mode == "checkpoint":
                # Saved: it computes no more, and the next job may take its GPUs as it exits.
                state.store.complete_suspend(job.id, job.attempts, time.time())
                state.wake.set()
        elif ack.request == "suspend" and detail.get("mode") == "park":
            if pending and record is not None and record.mode == "park":
                state.store.complete_suspend(job.id, job.attempts, time.time())
                state.transition(
                    job,
                    JobState.SUSPENDED,
                    f"{_turn_reason(record)}suspended (park mode) at step {detail.get('step')}: "
                    f"{_cost(detail)} moved to host memory; GPUs kept",
                )
            elif job.state is JobState.RUNNING:
                state.node_of(job.id).control.send(
                    job.id, ResumeRequest()
                )  # parked after a withdrawal
        elif ack.request == "resume" and job.state is JobState.RUNNING:
            state.transition(job, job.state, f"back on the device: {_cost(detail)}")
        elif ack.request == "checkpoint" and not safety.saved(state, job, detail.get("step")):
            state.transition(job, job.state, f"checkpoint saved on request: {_cost(detail)}")
