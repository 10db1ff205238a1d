"""Moves carried out: a running job checkpointed and restarted on exactly the GPUs the policy chose.

A policy moves a running job by binding it to other GPUs of its node
(`Decision.bindings`; `fifo` and `gpuq` do, through
`gpuq.policies.consolidate`), which `plan` makes a `move`. Only the
policy's own bindings are moves (`chosen`): where a time-slicing policy
runs, the slicer binds the jobs of a node it shares to their turns, and a
job it takes for turns is not moved (any other change of GPUs is a plain
preemption). The daemon carries a move out in three steps, each committed
before the next one acts:

1. **book** (`begin`): the move is written to the store (the job, its
   attempt, the GPUs it leaves and those it goes to, its memory share, the
   reason), then the job is preempted as any other (`suspend.preempt`: the
   checkpoint intent with the reason, then the request to its runner);
2. **checkpoint**: the runner saves at its next iteration boundary and
   exits; the job is queued again (`suspend.suspended_by_exit`);
3. **restart** (`settle`, first thing in every pass): a queued job with a
   booked move starts at once on its target GPUs, before the policy
   decides, with the move's reason.

From the booking until it restarts, the target GPUs are the job's: the
policy's view (`present`) shows it on them, so no other job is given them,
and says since when it moves (`JobView.moved_at`), so the policy does not
move it again soon. The GPUs it leaves look free to the policy, but no job
starts on them until it has left (`hold_back`): "waiting for job 3 to
checkpoint and move off GPU 0".

`settle` also reconciles each booked move with its job, which is all that
recovery after a crash needs (the book is in the store):

- the job runs a later attempt: the move is done, the entry goes;
- the job is queued: it restarts on its target GPUs (finished), unless one
  of them is gone: then the move is undone and the policy places the job;
  a job whose checkpoint could not be copied to another server waits for
  its `retry_at` first (`gpuq.daemon.transfer`);
- the job runs the booked attempt with no checkpoint pending (the daemon
  stopped between booking and asking, or the request was withdrawn or
  refused): undone, "the move to GPU 1 is undone: ...; it keeps running on
  GPU 0";
- the job is still checkpointing: wait;
- the job was suspended by its user, held, or ended: the entry goes.

The book is kept as JSON in the store's `policy_state` table under the key
`@moves` (no policy is called that), with each active job's last move time.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuq.daemon import faults, lifecycle, suspend
from gpuq.daemon.scheduler.binding import Placement
from gpuq.daemon.state import DaemonState
from gpuq.errors import StateError
from gpuq.models import Job, JobState
from gpuq.policies.actions import Action
from gpuq.policies.interface import ClusterState, Decision
from gpuq.policies.topology import gpus_label, positions_of

log = logging.getLogger("gpuq.daemon")

_HOLDING = frozenset({JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING})
"""States of a job whose process may still be on its GPUs."""

BOOK_KEY = "@moves"
"""The `policy_state` key of the book of moves."""
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Booked:
    """One move under way: job `job_id`'s attempt `attempt` goes from `source` to `target`."""

    job_id: int
    attempt: int
    source: tuple[str, ...]
    target: tuple[str, ...]
    gpu_mem: int | None
    reason: str
    requested: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "job": self.job_id,
            "attempt": self.attempt,
            "source": list(self.source),
            "target": list(self.target),
            "gpu_mem": self.gpu_mem,
            "reason": self.reason,
            "requested": self.requested,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Booked:
        """Read `to_dict`'s form back (KeyError, TypeError or ValueError if damaged)."""
        gpu_mem = data["gpu_mem"]
        return cls(
            int(data["job"]),
            int(data["attempt"]),
            tuple(str(uuid) for uuid in data["source"]),
            tuple(str(uuid) for uuid in data["target"]),
            None if gpu_mem is None else int(gpu_mem),
            str(data["reason"]),
            float(data["requested"]),
        )


@dataclass
class Book:
    """The moves under way by job, and when each active job was last moved."""

    moves: dict[int, Booked] = field(default_factory=dict)
    moved_at: dict[int, float] = field(default_factory=dict)

    def dumps(self) -> str:
        """The book as JSON text."""
        return json.dumps(
            {
                "version": _VERSION,
                "moves": [booked.to_dict() for booked in self.moves.values()],
                "moved_at": {str(job_id): t for job_id, t in self.moved_at.items()},
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def load(state: DaemonState) -> Book:
    """The book as last kept; an empty one if there is none or it cannot be read."""
    text = state.store.policy_state(BOOK_KEY)
    if text is None:
        return Book()
    try:
        return _parse(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("the book of moves is unreadable (%s); moves under way are forgotten", exc)
        return Book()


def _parse(data: Any) -> Book:
    """The book from its JSON form (ValueError, KeyError, TypeError if it is not one)."""
    if data.get("version") != _VERSION:
        raise ValueError(f"version {data.get('version')!r}")
    moves = [Booked.from_dict(entry) for entry in data["moves"]]
    moved_at = {int(k): float(v) for k, v in data["moved_at"].items()}
    return Book({booked.job_id: booked for booked in moves}, moved_at)


def save(state: DaemonState, book: Book) -> None:
    """Keep the book (raises StateError if it cannot be written)."""
    state.store.save_policy_state(BOOK_KEY, book.dumps(), time.time())


def begin(state: DaemonState, job: Job, action: Action) -> bool:
    """Book the move of a running job to `action.gpu_uuids`, then preempt it; False if not booked.

    A book that cannot be written (a full disk) leaves the job running as
    it is: without its booking, a move would restart it anywhere.
    """
    now = time.time()
    book = load(state)
    book.moves[job.id] = Booked(
        job.id,
        job.attempts,
        job.gpu_uuids,
        tuple(action.gpu_uuids),
        job.gpu_mem_reserved,
        action.reason,
        now,
    )
    book.moved_at[job.id] = now
    try:
        save(state, book)
    except StateError as exc:
        log.warning("job %d not moved: its move cannot be booked (%s)", job.id, exc)
        return False
    faults.crash_point("move-booked")
    suspend.preempt(state, job, action.reason, crash_point="move-committed")
    return True


def settle(state: DaemonState, cluster_gpus: Iterable[str]) -> Book:
    """Finish or undo every booked move as its job now stands (module docstring).

    `cluster_gpus` are the UUIDs of the GPUs the server has now. Returns
    the book as it stands after.
    """
    book = load(state)
    before = book.dumps()
    present = set(cluster_gpus)
    for job_id in [j for j in book.moved_at if j not in state.active]:
        del book.moved_at[job_id]
    for booked in list(book.moves.values()):
        job = state.active.get(booked.job_id)
        if _settle_one(state, booked, job, present):
            del book.moves[booked.job_id]
    if book.dumps() != before:
        try:
            save(state, book)
        except StateError as exc:
            log.warning("the book of moves is not kept: %s", exc)
    return book


def _settle_one(state: DaemonState, booked: Booked, job: Job | None, present: set[str]) -> bool:
    """Carry one booked move a step on; True once it is over (done, undone or moot)."""
    if job is None or job.attempts > booked.attempt:
        return True
    if job.state is JobState.SUSPENDING:
        return False
    if job.state is JobState.QUEUED:
        if job.retry_at is not None and job.retry_at > time.time():
            return False  # its checkpoint's copy failed: tried again at `retry_at`
        missing = [uuid for uuid in booked.target if uuid not in present]
        if missing and not present:
            return False  # no GPU sample yet: wait for one rather than undo
        if missing:
            state.transition(
                job,
                job.state,
                f"the move is undone: {', '.join(missing)} is gone; the job waits for GPUs",
            )
            return True
        faults.crash_point("move-checkpointed")
        lifecycle.start(state, job, Placement(job.id, booked.target, booked.gpu_mem), booked.reason)
        return False  # done once the job runs its next attempt
    if job.state is JobState.RUNNING:
        record = state.store.suspend_of(job.id, job.attempts)
        asked = record is not None and record.requested >= booked.requested
        why = "the job did not checkpoint" if asked else "the daemon stopped before asking it to"
        state.transition(
            job, job.state, f"{_undone(booked.reason)}: {why}; it keeps running where it was"
        )
    return True


def _undone(reason: str) -> str:
    """`the move to GPU 1 is undone`, from the move's reason (`moved to GPU 1: ...`)."""
    head = reason.partition(":")[0]
    if head.startswith("moved to "):
        return f"the move to {head.removeprefix('moved to ')} is undone"
    return "the move is undone"


def present(book: Book, state: DaemonState, cluster: ClusterState) -> ClusterState:
    """The policy's view with each moving job on its target GPUs and each job's last move time."""
    if not book.moves and not book.moved_at:
        return cluster
    node_index = {node.name: i for i, node in enumerate(cluster.nodes)}
    node_of = {gpu.uuid: node_index.get(gpu.node, 0) for gpu in cluster.gpus}
    jobs = []
    for view in cluster.jobs:
        moved_at = book.moved_at.get(view.id, view.moved_at)
        booked = book.moves.get(view.id)
        job = state.active.get(view.id)
        if booked is not None and job is not None and job.state is JobState.SUSPENDING:
            counts = [0] * len(cluster.nodes)
            for uuid in booked.target:
                counts[node_of.get(uuid, 0)] += 1
            view = replace(
                view,
                gpu_uuids=booked.target,
                allocation=tuple(counts),
                gpu_mem=booked.gpu_mem,
            )
        jobs.append(replace(view, moved_at=moved_at) if moved_at != view.moved_at else view)
    return replace(cluster, jobs=tuple(jobs))


def chosen(
    cluster: ClusterState, wanted: Decision, decided: Decision
) -> dict[int, tuple[str, ...]]:
    """The moves the policy chose: running jobs it binds to other GPUs, as many as they hold.

    `wanted` is the policy's decision and `decided` the one carried out
    (after the time-slicer): a binding the slicer changed or dropped is a
    turn, not a move.
    """
    found: dict[int, tuple[str, ...]] = {}
    for view in cluster.jobs:
        target = wanted.bindings.get(view.id)
        if not view.gpu_uuids or view.suspended or not target:
            continue
        if len(target) != len(view.gpu_uuids) or set(target) == set(view.gpu_uuids):
            continue
        if tuple(decided.bindings.get(view.id, ())) == tuple(target):
            found[view.id] = tuple(target)
    return found


def hold_back(
    state: DaemonState,
    cluster: ClusterState,
    bindings: Mapping[int, tuple[str, ...]],
    starts: list[Placement],
    waiting: dict[int, str],
) -> list[Placement]:
    """The starts to make now: none on GPUs a moving job has not left yet (it waits, saying so).

    A job is leaving GPUs it still holds when it has a move booked (read
    afresh: this very pass may have booked it) or when the decision's
    `bindings` put it elsewhere (a move that could not begin: the
    placements counted on it).
    """
    booked = load(state).moves
    leaving: dict[int, set[str]] = {}
    for job in state.active.values():
        if job.state not in _HOLDING or not job.gpu_uuids:
            continue
        bound = bindings.get(job.id)
        if job.id in booked or (bound is not None and set(bound) != set(job.gpu_uuids)):
            leaving[job.id] = set(job.gpu_uuids)
    if not leaving:
        return starts
    kept = []
    for placement in starts:
        blocked = next(
            (
                (job_id, sorted(uuids.intersection(placement.gpu_uuids)))
                for job_id, uuids in leaving.items()
                if job_id != placement.job_id and uuids.intersection(placement.gpu_uuids)
            ),
            None,
        )
        if blocked is None:
            kept.append(placement)
            continue
        job_id, uuids = blocked
        where = gpus_label(cluster, positions_of(cluster, uuids)) if cluster.gpus else "its GPUs"
        waiting[placement.job_id] = f"waiting for job {job_id} to checkpoint and move off {where}"
    return kept


__all__ = [
    "BOOK_KEY",
    "Book",
    "Booked",
    "begin",
    "chosen",
    "hold_back",
    "load",
    "present",
    "settle",
]
