"""The actuator: a policy's decision carried out on what runs, each action with its reason.

`gpuq.policies.actions.plan` lists what must change for the server to match
the decision; here each change becomes a lifecycle or suspend call:

- `start` and `resume` of a queued job: the binding's placements
  (`binding.placements`), which the tick starts in slices;
- `suspend`, `resize` and `move` of a running job: a preemption
  (`suspend.preempt`): the intent is committed with the action's reason, the
  runner checkpoints at its next iteration boundary and the job is queued
  again, to restart from its checkpoint on the GPUs the policy gives it next;
  a `move` to GPUs the policy itself chose (`moves.chosen`, never the
  slicer's turns) is booked first and restarts on exactly those
  (`moves.begin`);
- a `suspend` in park or stop mode (the slicer's, for another job's turn):
  `suspend.take_turn`; the `resume` of a job parked or stopped that way:
  `suspend.give_turn`, once no other job computes on its GPUs (`resume_turns`);
- `pack` and `unpack`: carried out before the rest by
  `gpuq.daemon.scheduler.packing` (a guest joins a running job's GPU, or
  leaves it), which also takes the joining and leaving jobs' other actions.

Only what the scheduler owns is acted on: a preemption only of a running job
whose runner checkpoints (the view tells the policy which are
`preemptible`); a job suspended by its user, already being suspended, or
still starting is left as it is, and the next pass sees it again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuq.daemon import suspend
from gpuq.daemon.scheduler import moves
from gpuq.daemon.scheduler.slicer import Waiting
from gpuq.daemon.state import DaemonState
from gpuq.models import Job, JobState
from gpuq.policies.actions import Action, Kind
from gpuq.policies.interface import ClusterState

HOLDING = frozenset({JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING})
"""States of a job whose process may be computing on its GPUs (or leaving them)."""
TURN_MODES = frozenset({"park", "stop"})

log = logging.getLogger("gpuq.daemon")

PREEMPTING = frozenset({Kind.SUSPEND, Kind.RESIZE, Kind.MOVE})
"""Actions that take a running job off its GPUs."""


@dataclass(frozen=True, slots=True)
class Preemptions:
    """What became of a decision's preemptions: started now, or refused (not preemptible)."""

    started: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()

    def release_reason(self) -> str | None:
        """Why a job placed on GPUs still held waits, or None if nothing is being freed."""
        if self.refused:
            return (
                f"waiting for job {_ids(self.refused)}, which the policy would preempt "
                "but cannot: only a job whose gpuq.runner checkpoints can be"
            )
        if self.started:
            return f"waiting for job {_ids(self.started)} to checkpoint and free its GPUs"
        return None


def _ids(ids: tuple[int, ...]) -> str:
    return ", ".join(map(str, ids))


def preempt(
    state: DaemonState,
    actions: tuple[Action, ...],
    moved: Mapping[int, tuple[str, ...]],
) -> Preemptions:
    """Carry out every suspend, resize and move the scheduler may (module docstring).

    `moved` holds the moves the policy chose (`moves.chosen`), each booked.
    """
    started: list[int] = []
    refused: list[int] = []
    for action in actions:
        if action.kind not in PREEMPTING:
            continue
        job = state.active.get(action.job_id)
        if job is None:
            continue
        if job.state is JobState.SUSPENDING:
            started.append(job.id)  # already on its way off its GPUs
        elif action.mode in TURN_MODES and job.state is JobState.RUNNING:
            suspend.take_turn(state, job, action.mode, action.reason)
            started.append(job.id)
        elif suspend.can_preempt(state, job):
            if action.kind is Kind.MOVE and moved.get(job.id) == action.gpu_uuids:
                if moves.begin(state, job, action):
                    started.append(job.id)
                continue
            suspend.preempt(state, job, action.reason)
            started.append(job.id)
        elif job.state is JobState.RUNNING:
            refused.append(job.id)
    if started:
        log.info("preempting job(s) %s", _ids(tuple(started)))
    return Preemptions(tuple(started), tuple(refused))


def computing_on(state: DaemonState, uuids: Iterable[str], but: int) -> list[int]:
    """The jobs other than `but` that may compute on any of `uuids` (or are leaving them).

    A job whose checkpoint is saved computes no more: its process only exits.
    """
    wanted = set(uuids)
    return sorted(
        job.id
        for job in state.active.values()
        if job.id != but
        and job.state in HOLDING
        and wanted.intersection(job.gpu_uuids)
        and not _saved(state, job)
    )


def _saved(state: DaemonState, job: Job) -> bool:
    """True for a job leaving its GPUs whose checkpoint is saved (`suspend` completed it)."""
    if job.state is not JobState.SUSPENDING:
        return False
    record = state.store.suspend_of(job.id, job.attempts)
    return record is not None and record.mode == "checkpoint" and record.completed is not None


def resume_turns(state: DaemonState, actions: tuple[Action, ...]) -> dict[int, str]:
    """Give their turn to the jobs parked or stopped for one; why each other one still waits."""
    waiting: dict[int, str] = {}
    for action in actions:
        job = state.active.get(action.job_id)
        if action.kind is not Kind.RESUME or job is None or job.state is not JobState.SUSPENDED:
            continue
        if not _sliced(state, job):
            continue
        busy = computing_on(state, job.gpu_uuids, job.id)
        if busy:
            waiting[job.id] = f"its turn: waiting for job {', '.join(map(str, busy))} to leave"
            continue
        suspend.give_turn(state, job, action.reason)
    return waiting


def _sliced(state: DaemonState, job: Job) -> bool:
    record = state.store.suspend_of(job.id, job.attempts)
    return record is not None and record.purpose == "slice"


def _refused(state: DaemonState, job: Job, since: float) -> bool:
    """True if the scheduler asked the job to leave its GPUs after `since` and it did not."""
    record = state.store.suspend_of(job.id, job.attempts)
    return (
        record is not None
        and record.purpose in ("slice", "policy")
        and record.completed is None
        and record.requested > since
    )


def turn_info(
    state: DaemonState, cluster: ClusterState, now: float, retry: float
) -> dict[int, Waiting]:
    """How each job of the policy's state could wait for its turn (`slicer.Waiting`).

    A job that refused to leave its GPUs (a runner still starting, with no
    State to save yet) keeps them until `retry` seconds after it was asked.
    """
    info: dict[int, Waiting] = {}
    for view in cluster.jobs:
        job = state.active.get(view.id)
        if job is None:
            continue
        runner = state.node_of(job.id).control.runner(job.id)
        modes = {"stop"}
        if runner is not None:
            modes.update(set(runner.features) & {"park", "checkpoint"})
        if job.state is JobState.SUSPENDED and not _sliced(state, job):
            modes = set()  # suspended by its user: only its user resumes it
        elif job.state is JobState.RUNNING and _refused(state, job, now - retry):
            modes = set()  # it refused its last turn's end: not again before `retry`
        sample = state.latest_samples.get(job.id, {})
        known = [
            state.memory_peaks.get(job.id),
            sample.get("memory_peak_bytes"),
            job.gpu_mem_reserved or job.spec.gpu_mem,
            state.packs.raised.get(job.id),  # it ran out of memory packed: it needs more
        ]
        sizes = [int(n) for n in known if isinstance(n, int) and n > 0]
        info[view.id] = Waiting(
            frozenset(modes),
            max(sizes) if sizes else None,
            leaving=job.state is JobState.SUSPENDING,
            resumable=job.state is not JobState.SUSPENDED or _sliced(state, job),
            saved=_saved(state, job),
        )
    return info
