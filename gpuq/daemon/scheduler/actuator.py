"""The actuator: a policy's decision carried out on what runs, each action with its reason.

`gpuq.policies.actions.plan` lists what must change for the server to match
the decision; here each change becomes a lifecycle or suspend call:

- `start` and `resume` of a queued job: the binding's placements
  (`binding.placements`), which the tick starts in slices;
- `suspend`, `resize` and `move` of a running job: a preemption
  (`suspend.preempt`): the intent is committed with the action's reason, the
  runner checkpoints at its next iteration boundary and the job is queued
  again, to restart from its checkpoint on the GPUs the policy gives it next;
- `pack` and `unpack`: no policy the daemon runs packs yet, so none arrive.

Only what the scheduler owns is acted on: a preemption only of a running job
whose runner checkpoints (the view tells the policy which are
`preemptible`); a job suspended by its user, already being suspended, or
still starting is left as it is, and the next pass sees it again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpuq.daemon import suspend
from gpuq.daemon.state import DaemonState
from gpuq.models import JobState
from gpuq.policies.actions import Action, Kind

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


def preempt(state: DaemonState, actions: tuple[Action, ...]) -> Preemptions:
    """Carry out every suspend, resize and move the scheduler may (module docstring)."""
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
        elif suspend.can_preempt(state, job):
            suspend.preempt(state, job, action.reason)
            started.append(job.id)
        elif job.state is JobState.RUNNING:
            refused.append(job.id)
    if started:
        log.info("preempting job(s) %s", _ids(tuple(started)))
    return Preemptions(tuple(started), tuple(refused))
