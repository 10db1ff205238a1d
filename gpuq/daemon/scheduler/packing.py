"""Packing carried out live: a guest joins a running job's GPU, and leaves it again (Gandiva).

A packing policy puts pairs on one GPU at once (`Decision.packed`); `plan`
turns a new pair into `pack` actions and a dissolved one into `unpack`
actions. Here each is carried out, every step committed to the book of
packs (`PackBook`, `memory.commit_packs`) before it is acted on.

**Pack.** The anchor (`packs.anchor_of`: the member computing now) keeps its
GPUs and the other member, the guest, joins them: a guest waiting in the
queue (never started, or checkpointed for its turn) starts on the anchor's
GPUs with a memory share of what it needs; one parked or stopped on those
GPUs for its turn gets its turn back while the anchor computes
(`suspend.give_turn`); one running on other GPUs is checkpointed first and
starts on the anchor's GPUs once it is queued (the view shows it to the
policy where it is going meanwhile: `introspect.enrich`). A guest parked on
other GPUs, or suspended by its user, is not packed: it goes on as it is
(taking its turns) and says why. The step is committed as `packing`
(crash point `pack-committed`) and becomes `packed` once the guest
computes on the GPUs.

**Unpack.** One member leaves the shared GPUs: the one the decision (after
the time-slicer) takes off for another's turn, parked or stopped as the
slicer asked; else the guest, checkpointed (a runner job) so that it
restarts on a GPU of its own or takes turns. The step is committed as
`unpacking` (crash point `unpack-committed`); the record goes once the
member has left.

Both members' event logs get the action's reason ("packed with job 7:
trial on n1 (utilization 30% + 30%)", "unpacked from job 7: packed
throughput 0.71 of time-sliced (0.36+0.35 of solo), undone on n1").

**Recovery** is the same code: the book is restored when the daemon starts,
and every pass first settles it with the jobs and the decision (`settle`).
A `packing` step the policy still wants is finished (the queued guest is
started, the parked one resumed); one it no longer wants becomes an unpack;
an `unpacking` step whose member still computes on the shared GPUs takes it
off again. A step an earlier daemon committed is finished "after a daemon
restart", as its reason says. Records of jobs that ended are dropped.

Not done: a job without gpuq.runner reports no step times, so the policy
never measures it alone and never packs it (Gandiva's utilization-only
judgement of such jobs is not made); packs are pairs of single-GPU jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuq.daemon import faults, lifecycle, suspend
from gpuq.daemon.scheduler import memory
from gpuq.daemon.scheduler.binding import Placement
from gpuq.daemon.scheduler.constraints import misplaced, refusal
from gpuq.daemon.scheduler.introspect import COMPUTING
from gpuq.daemon.scheduler.packs import PackRecord, anchor_of
from gpuq.daemon.scheduler.view import view_nodes
from gpuq.daemon.state import DaemonState
from gpuq.errors import StateError
from gpuq.models import Job, JobState
from gpuq.policies.actions import Action, Kind, plan
from gpuq.policies.interface import ClusterState, Decision, JobView

log = logging.getLogger("gpuq.daemon")

RESTARTED = " (finished after a daemon restart)"


@dataclass(slots=True)
class Packing:
    """What carrying out the packs did to the pass.

    `handled`: jobs whose start, resume or suspend was carried out (or held
    back) here, which the rest of the pass must leave alone; `waiting`: why
    each held-back job waits.
    """

    handled: set[int] = field(default_factory=set)
    waiting: dict[int, str] = field(default_factory=dict)

    def hold(self, job_id: int, why: str) -> None:
        """Keep the job where it is this pass, saying why."""
        self.handled.add(job_id)
        self.waiting[job_id] = why

    def rest(self, actions: tuple[Action, ...]) -> tuple[Action, ...]:
        """The actions left for the actuator: none of a handled job."""
        return tuple(action for action in actions if action.job_id not in self.handled)

    def starts(self, starts: list[Placement]) -> list[Placement]:
        """The starts left for the tick: none of a handled job."""
        return [placement for placement in starts if placement.job_id not in self.handled]


def carry_out(
    state: DaemonState,
    cluster: ClusterState,
    wanted: Decision,
    decided: Decision,
    actions: tuple[Action, ...],
) -> Packing:
    """Settle the book, then carry out the decision's unpacks and packs (module docstring).

    `wanted` is the policy's decision (its reasons), `decided` the one the
    pass carries out (after the time-slicer: who waits for a turn, and how),
    and `actions` the plan of `decided`.
    """
    result = Packing()
    kinds = {Kind.PACK, Kind.UNPACK}
    if not state.packs.records and not any(action.kind in kinds for action in actions):
        return result
    views = {view.id: view for view in cluster.jobs}
    reasons = {(a.kind, a.job_id): a.reason for a in plan(cluster, wanted) if a.kind in kinds}
    suspends = {a.job_id: a for a in actions if a.kind is Kind.SUSPEND}
    groups = {frozenset(group) for group in wanted.packed if len(set(group)) > 1}
    try:
        settle(state, views, groups, suspends, result)
        for kind in (Kind.UNPACK, Kind.PACK):
            done: set[frozenset[int]] = set()
            for action in actions:
                group = frozenset((action.job_id, *action.partners))
                if action.kind is not kind or group in done:
                    continue
                done.add(group)
                if kind is Kind.UNPACK:
                    _unpack(state, group, suspends, reasons, result)
                else:
                    _pack(state, group, views, reasons, result)
    except StateError as exc:  # the intent could not be committed: act on nothing more
        log.warning("packing deferred: %s", exc)
    return result


def settle(
    state: DaemonState,
    views: Mapping[int, JobView],
    wanted: set[frozenset[int]],
    suspends: Mapping[int, Action],
    result: Packing,
) -> None:
    """Finish the steps in progress, and forget what concerns only jobs that ended."""
    book = state.packs
    book.prune(state.active)
    for record in sorted(book.records.values(), key=lambda r: (r.host, r.guest)):
        note = RESTARTED if record.daemon != state.started else ""
        guest = state.active.get(record.guest)
        if record.phase == "packing" and record.members in wanted:
            _join(state, record, views, result, note)
        elif record.phase == "packing" and guest is not None and not _on(guest, record.gpu_uuids):
            book.drop(record)  # the policy changed its mind before the guest joined
            why = f"not packed with job {record.host} after all: the policy no longer packs them"
            state.transition(
                guest, guest.state, why + (" (after a daemon restart)" if note else "")
            )
        elif record.phase == "unpacking" and record.leaving is not None:
            leaving = state.active.get(record.leaving)
            if leaving is None or not _on(leaving, record.gpu_uuids):
                book.drop(record)
                log.info("jobs %d and %d unpacked", record.host, record.guest)
            elif leaving.state is JobState.RUNNING:
                action = suspends.get(leaving.id)
                _take_off(state, leaving, action.mode if action else None, record.reason + note)
                result.handled.add(leaving.id)
    memory.commit_packs(state)


def _on(job: Job, uuids: tuple[str, ...]) -> bool:
    """True if the job computes (or is starting, or leaving) on any of `uuids`."""
    return job.state in COMPUTING and bool(set(job.gpu_uuids) & set(uuids))


def _reason(reasons: Mapping[tuple[Kind, int], str], kind: Kind, job_id: int, other: int) -> str:
    verb = "packed with" if kind is Kind.PACK else "unpacked from"
    return reasons.get((kind, job_id), f"{verb} job {other}")


def _pack(
    state: DaemonState,
    group: frozenset[int],
    views: Mapping[int, JobView],
    reasons: Mapping[tuple[Kind, int], str],
    result: Packing,
) -> None:
    """Commit a new pack and have its guest join the anchor's GPUs."""
    book = state.packs
    if len(group) != 2 or book.of(min(group)) or book.of(max(group)):
        return  # gpuq packs pairs, each job in one pack at a time
    anchor = anchor_of(group, views)
    (guest,) = group - {anchor}
    host_job, guest_job = state.active.get(anchor), state.active.get(guest)
    if host_job is None or guest_job is None:
        return
    if group in book.failed:
        result.hold(guest, f"not packed with job {anchor}: it ran out of GPU memory beside it")
        return
    if host_job.state is not JobState.RUNNING:
        result.hold(guest, f"waiting to be packed with job {anchor} once it computes")
        return
    blocker = _cannot_join(state, guest_job, host_job) or _outside(state, views, guest, host_job)
    if blocker:  # it goes on as it is (its turns included), and says why it is not packed
        log.info("job %d: %s", guest, blocker)
        result.waiting[guest] = blocker
        return
    record = PackRecord(
        host=anchor,
        guest=guest,
        gpu_uuids=host_job.gpu_uuids,
        phase="packing",
        reason=_reason(reasons, Kind.PACK, guest, anchor),
        since=time.time(),
        daemon=state.started,
    )
    book.put(record)
    try:
        memory.commit_packs(state)
    except StateError:
        book.drop(record)
        raise
    state.transition(host_job, host_job.state, _reason(reasons, Kind.PACK, anchor, guest))
    faults.crash_point("pack-committed")
    _join(state, record, views, result, "")


def _cannot_join(state: DaemonState, guest: Job, host: Job) -> str | None:
    """Why `guest` cannot join `host`'s GPUs now, or None if it can."""
    if guest.state is JobState.SUSPENDED and not suspend.is_checkpointed(state, guest):
        record = state.store.suspend_of(guest.id, guest.attempts)
        if record is None or record.purpose != "slice":
            return f"not packed with job {host.id}: suspended by its user"
        if set(guest.gpu_uuids) != set(host.gpu_uuids):
            return f"not packed with job {host.id}: it waits for its turn on another GPU"
    if guest.state is JobState.RUNNING and not suspend.can_preempt(state, guest):
        return f"not packed with job {host.id}: it cannot move (no gpuq.runner to checkpoint)"
    return None


def _outside(state: DaemonState, views: Mapping[int, JobView], guest: int, host: Job) -> str:
    """Why `guest` may not join `host`'s GPUs: their node is outside its constraint ("": may)."""
    view = views.get(guest)
    if view is None or view.nodes is None:
        return ""
    node_of = {uuid: name for uuid, (name, _) in view_nodes(state.gpus.devices).items()}
    wrong = misplaced(node_of, view, host.gpu_uuids)
    return f"not packed with job {host.id}: {refusal(view, wrong)}" if wrong else ""


def _join(
    state: DaemonState,
    record: PackRecord,
    views: Mapping[int, JobView],
    result: Packing,
    note: str,
) -> None:
    """Take the guest one step closer to computing on the host's GPUs (module docstring)."""
    book = state.packs
    guest, host = state.active.get(record.guest), state.active.get(record.host)
    if guest is None or host is None:
        return
    result.handled.add(guest.id)
    reason = record.reason + note
    if _on(guest, record.gpu_uuids):
        if guest.state is not JobState.SUSPENDING:
            book.step(record, phase="packed", since=time.time())
            memory.commit_packs(state)
        return
    if host.state is not JobState.RUNNING or not _on(host, record.gpu_uuids):
        result.waiting[guest.id] = f"waiting to be packed with job {host.id} once it computes"
        return
    view = views.get(guest.id)
    if guest.state is JobState.QUEUED:
        if view is None or view.gpu_uuids:
            result.waiting[guest.id] = f"waiting to be packed with job {host.id}"
            return
        need = view.gpu_mem or view.memory_peak
        guest = state.transition(guest, JobState.QUEUED, reason)
        lifecycle.start(state, guest, Placement(guest.id, record.gpu_uuids, need))
    elif guest.state is JobState.SUSPENDED and set(guest.gpu_uuids) == set(record.gpu_uuids):
        if suspend.is_checkpointed(state, guest):
            return
        suspend.give_turn(state, guest, reason)
    elif guest.state is JobState.RUNNING and suspend.can_preempt(state, guest):
        suspend.preempt(state, guest, f"{reason}: moving onto job {host.id}'s GPU")


def _unpack(
    state: DaemonState,
    group: frozenset[int],
    suspends: Mapping[int, Action],
    reasons: Mapping[tuple[Kind, int], str],
    result: Packing,
) -> None:
    """Commit an unpack and take one member off the shared GPUs (module docstring)."""
    book = state.packs
    record = book.records.get(group)
    if record is None or record.phase == "unpacking":
        return
    jobs = {j: state.active.get(j) for j in group}
    on = [j for j, job in sorted(jobs.items()) if job is not None and _on(job, record.gpu_uuids)]
    if record.guest not in on:  # it never joined: nothing to take off
        book.drop(record)
        memory.commit_packs(state)
        guest = jobs[record.guest]
        if guest is not None:
            why = _reason(reasons, Kind.UNPACK, guest.id, record.host)
            state.transition(guest, guest.state, f"{why} before it joined")
        return
    leaving = next((j for j in on if j in suspends), record.guest)
    other = record.partner(leaving)
    reason = _reason(reasons, Kind.UNPACK, leaving, other)
    record = book.step(
        record,
        phase="unpacking",
        leaving=leaving,
        reason=reason,
        since=time.time(),
        daemon=state.started,
    )
    memory.commit_packs(state)
    staying = jobs[other]
    if staying is not None:
        state.transition(staying, staying.state, _reason(reasons, Kind.UNPACK, other, leaving))
    faults.crash_point("unpack-committed")
    job = jobs[leaving]
    assert job is not None  # it computes on the GPUs
    action = suspends.get(leaving)
    _take_off(state, state.active.get(leaving, job), action.mode if action else None, reason)
    result.handled.add(leaving)


def _take_off(state: DaemonState, job: Job, mode: str | None, reason: str) -> None:
    """Take a running job off its GPUs: for its turn (park or stop), else by checkpoint."""
    if job.state is not JobState.RUNNING:
        return  # leaving already, or still starting: the next pass sees it again
    if mode in ("park", "stop"):
        suspend.take_turn(state, job, mode, reason)
    elif suspend.can_preempt(state, job):
        suspend.preempt(state, job, reason)
    else:
        runner = state.node_of(job.id).control.runner(job.id)
        turn = "park" if runner is not None and "park" in runner.features else "stop"
        suspend.take_turn(state, job, turn, reason)
