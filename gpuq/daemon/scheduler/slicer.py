"""The time-slicer: jobs take turns on a node a time-slicing policy over-subscribes.

Gandiva's decisions may give a node's jobs more GPUs than it has
(`Capabilities.time_slicing`); the simulator then runs each at GPUs/demand
of its speed, and here the daemon makes that true in turns. At every pass
the slicer picks, per over-subscribed node, which of its jobs compute now,
on which GPUs, and how the others wait. Pure: unit-tested without a daemon.

- **Fair turns** (deficit round robin): each job sharing a node is owed
  `dt x G / D` seconds for every `dt` (G the node's GPUs, D the GPUs its
  jobs ask for together) and pays `dt` while it computes; at a turn's end
  the jobs owed most compute next. Over a long window each job computes
  for G / D of it, whatever its GPU count.
- **Shares** (lab mode, `ClusterState.fair`, jobs of several users on the
  node): each job's part of the node's time is weighted by its owner's
  share over the GPUs that owner's jobs ask for there, so each user's jobs
  together compute for their share of the node (`turn_rates`).
- **Quanta**: a job that begins a turn keeps its GPUs for `quantum`
  seconds (the policy's, `Capabilities.quantum`); the pass at the end of
  the earliest turn is the next one the caller must make (`Slices.wake`).
- **How a job waits**: *parked* (a gpuq.runner job: its state moved to host
  memory, its CUDA context left on the GPU) when its resident memory fits
  beside the job taking its GPUs; *stopped* (SIGSTOP, for a job without the
  runner) only when its whole memory is known and fits beside the next
  one; else *checkpointed* (a runner job, whose GPUs are freed). A job that
  cannot wait in any of these ways is not time-sliced: it keeps its GPUs
  and the jobs behind it wait, saying why.
- **Hand-over**: a job's GPUs pass to the next one as soon as it has parked
  or stopped, or, checkpointed, as soon as its checkpoint is saved
  (`Waiting.saved`): its process only exits then (seconds, for a PyTorch
  process), which the next job need not wait for if its memory fits beside
  the exiting one's.
- **Packs**: a packed group (`Decision.packed`) takes turns as one job: its
  anchor (`gpuq.daemon.scheduler.packs.anchor_of`) is sliced, and the others
  compute on its GPUs in its turns and wait with it.
- **Pins and moves**: a parked or stopped job can compute again only on the
  GPUs it holds. Pins alone would fix each GPU's share by how many jobs it
  holds (six jobs on four GPUs: two GPUs of two jobs and two of one), so a
  job leaving its GPUs is checkpointed instead of parked, and takes the
  GPUs of a job computing alone at that job's turn's end (`heading`), when
  the jobs of its GPUs are owed `rebalance` seconds more than that one; of
  the jobs sharing its GPUs, the one moved least so far moves (`moved`),
  so restarts are shared, and the one most behind stays, to compute alone.
  A job also moves when GPUs of the node sit idle. Over a long window each
  job's share is within a few percent of G / D; over a shorter one, within
  about `rebalance` plus a turn.

What it remembers (each job's credit, its turn's start, the jobs it
checkpointed for their turn and their share of the node, where moving jobs
head and how often each moved) is saved with the policy's memory, so a
restart keeps the turns. Where memory fits, and so how a job can wait, is
`gpuq.daemon.scheduler.room`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuq.daemon.scheduler.packs import guests_of
from gpuq.daemon.scheduler.room import (
    PARK_RESIDENT_BYTES,
    SlicedNode,
    Waiting,
    alone,
    can_leave,
    computing,
    fits_beside_exiting,
    fits_on,
    place,
    saved,
    sharing,
    wait_mode,
)
from gpuq.fairshare import Fairness, turn_shares
from gpuq.policies.interface import ClusterState, Decision, JobView, Policy

__all__ = ["PARK_RESIDENT_BYTES", "REBALANCE_QUANTA", "Slicer", "Slices", "Waiting", "slicer_for"]

REBALANCE_QUANTA = 4
"""A job leaving its GPUs moves (checkpoint) when owed this many quanta more than one elsewhere."""


@dataclass(frozen=True, slots=True)
class Slices:
    """What to carry out now: `decision` over-subscribes no node; `wake` is the next turn's end."""

    decision: Decision
    wake: float | None = None
    sliced: frozenset[int] = frozenset()


@dataclass(slots=True)
class Slicer:
    """Turns on over-subscribed nodes; see the module docstring."""

    quantum: float = 60.0
    rebalance: float | None = None
    credit: dict[int, float] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)
    shares: dict[int, tuple[int, ...]] = field(default_factory=dict)
    rate: dict[int, float] = field(default_factory=dict)
    heading: dict[int, int] = field(default_factory=dict)
    moved: dict[int, int] = field(default_factory=dict)
    last: float | None = None

    def __post_init__(self) -> None:
        if self.quantum <= 0:
            raise ValueError(f"quantum must be positive, got {self.quantum}")
        if self.rebalance is None:
            self.rebalance = REBALANCE_QUANTA * self.quantum

    def present(self, state: ClusterState) -> ClusterState:
        """`state` as the policy must see it: a job checkpointed for its turn keeps its share.

        Such a job is queued in the daemon, holding nothing; the policy,
        which over-subscribed the node on purpose, sees it where it left it.
        """
        if not self.shares:
            return state
        jobs = tuple(
            replace(job, allocation=self.shares[job.id], suspended=True)
            if job.id in self.shares and not job.gpu_uuids
            else job
            for job in state.jobs
        )
        return replace(state, jobs=jobs)

    def needed(self, state: ClusterState, decision: Decision) -> bool:
        """True if this pass has turns to take: jobs in turns, or a node over-subscribed now.

        Where it is False, `slice` would return the decision as it is, so the
        caller may skip it (and what it costs to ask how each job can wait).
        """
        if self.shares or self.rate:
            return True
        jobs = {job.id: job for job in state.jobs}
        guests = guests_of(decision.packed, jobs)
        return bool(self._oversubscribed(state, decision, jobs, guests))

    def slice(
        self,
        state: ClusterState,
        decision: Decision,
        waiting: Mapping[int, Waiting],
        now: float,
    ) -> Slices:
        """The part of `decision` that computes now, and how the rest waits (module docstring)."""
        jobs = {job.id: job for job in state.jobs}
        guests = guests_of(decision.packed, jobs)
        self._account(jobs, waiting, now)
        nodes = self._oversubscribed(state, decision, jobs, guests)
        sliced = {job.id for node in nodes for job in node.members}
        self.credit = {j: c for j, c in self.credit.items() if j in sliced}
        self.since = {j: t for j, t in self.since.items() if j in sliced}
        self.heading = {j: k for j, k in self.heading.items() if j in sliced and k in sliced}
        self.moved = {j: n for j, n in self.moved.items() if j in sliced}
        self.shares = {j: decision.allocations[j] for j in sorted(sliced)}
        self.rate = {}
        allocations = {j: a for j, a in decision.allocations.items() if j not in sliced}
        bindings = {j: b for j, b in decision.bindings.items() if j not in sliced}
        modes = dict(decision.suspend_modes)
        notes = dict(decision.notes)
        ends: list[float] = []
        for node in nodes:
            self.rate.update(turn_rates(node, state.fair))
            for job in node.members:
                self.credit.setdefault(job.id, 0.0)
            runs = self._turns(node, waiting, now, notes)
            for job_id, uuids in runs.items():
                allocations[job_id] = decision.allocations[job_id]
                bindings[job_id] = uuids
                if not computing(jobs[job_id], waiting) or self._turn_over(job_id, now):
                    self.since[job_id] = now
                ends.append(self.since[job_id] + self.quantum)
            self._leave(node, runs, waiting, modes, notes)
            for job in node.members:
                if job.id not in runs:
                    self.since.pop(job.id, None)
        for guest, anchor in guests.items():
            if anchor in sliced and guest in decision.allocations:
                self._follow(jobs[guest], anchor, allocations, bindings, waiting, modes, notes)
        decided = Decision(
            allocations=allocations,
            batch_sizes=decision.batch_sizes,
            packed=decision.packed,
            bindings=bindings,
            suspend_modes=modes,
            notes=notes,
        )
        return Slices(decided, min(ends, default=None), frozenset(sliced))

    @staticmethod
    def _follow(
        guest: JobView,
        anchor: int,
        allocations: dict[int, tuple[int, ...]],
        bindings: dict[int, tuple[str, ...]],
        waiting: Mapping[int, Waiting],
        modes: dict[int, str],
        notes: dict[int, str],
    ) -> None:
        """A packed guest takes its anchor's turns: on its GPUs when it computes, else waits."""
        if anchor in allocations and anchor in bindings:
            bindings[guest.id] = bindings[anchor]
            return
        allocations.pop(guest.id, None)
        bindings.pop(guest.id, None)
        if computing(guest, waiting):
            can = waiting.get(guest.id, Waiting()).modes
            modes[guest.id] = next((m for m in ("park", "checkpoint") if m in can), "stop")
        notes[guest.id] = f"packed with job {anchor}: waiting for its turn with it"

    def _account(
        self, jobs: Mapping[int, JobView], waiting: Mapping[int, Waiting], now: float
    ) -> None:
        """Credit every member its fair share of the time since the last pass, less what it ran."""
        if self.last is not None and now > self.last:
            dt = now - self.last
            for job_id, rate in self.rate.items():
                job = jobs.get(job_id)
                if job is not None:
                    ran = dt if computing(job, waiting) else 0.0
                    self.credit[job_id] = self.credit.get(job_id, 0.0) + dt * rate - ran
        self.last = now if self.last is None else max(self.last, now)

    def _oversubscribed(
        self,
        state: ClusterState,
        decision: Decision,
        jobs: Mapping[int, JobView],
        guests: Mapping[int, int],
    ) -> list[SlicedNode]:
        """The nodes to slice, with their one-node jobs.

        Those the decision gives more GPUs than they have, and those whose jobs
        still wait from their last turns (`SlicedNode.over`). A packed guest adds
        no demand: it computes on its anchor's GPUs, in its anchor's turns.
        Memory-share jobs the decision binds to GPUs (placed as shares, beside
        others at once) are no members, and their GPUs are not the node's to
        share in turns; a job with memory the decision does not bind is a
        member like any other.
        """
        found = []
        shares = {
            job_id
            for job_id in decision.allocations
            if job_id in decision.bindings and job_id in jobs and jobs[job_id].gpu_mem is not None
        }
        shared = {uuid for job_id in shares for uuid in decision.bindings[job_id]}
        for index, node in enumerate(state.nodes):
            members = []
            demand = 0
            for job_id, allocation in decision.allocations.items():
                if job_id in guests or job_id in shares:
                    continue  # a packed guest, or a memory share: not time-sliced
                if index < len(allocation) and allocation[index] > 0 and job_id in jobs:
                    demand += allocation[index]
                    if sum(allocation) == allocation[index]:
                        members.append(jobs[job_id])
            gpus = tuple(g for g in state.gpus if g.node == node.name and g.uuid not in shared)
            over = demand > (len(gpus) if state.gpus else node.gpus)
            settling = any(
                job.id in self.shares and (job.suspended or not job.gpu_uuids) for job in members
            )
            if not members or not (over or settling):
                continue
            usable = {
                g.uuid: int(g.memory_total * (1 - state.memory_margin)) - g.memory_foreign
                for g in gpus
            }
            size = {job.id: sum(decision.allocations[job.id]) for job in members}
            uuids = tuple(g.uuid for g in gpus)
            found.append(SlicedNode(index, uuids, usable, members, size, over))
        return found

    def _turns(
        self,
        node: SlicedNode,
        waiting: Mapping[int, Waiting],
        now: float,
        notes: dict[int, str],
    ) -> dict[int, tuple[str, ...]]:
        """Which members compute now, on which GPUs: turns not over first, then by credit.

        A job leaving its GPUs still holds them; a job computing that cannot
        wait keeps them. Jobs holding no GPUs reserve capacity in credit
        order and are placed last, on the GPUs nobody claimed.
        """
        runs: dict[int, tuple[str, ...]] = {}
        firm = [
            job
            for job in node.members
            if job.gpu_uuids
            and not waiting.get(job.id, Waiting()).saved
            and (
                waiting.get(job.id, Waiting()).leaving
                or not waiting.get(job.id, Waiting()).resumable
                or (
                    computing(job, waiting)
                    and (not self._turn_over(job.id, now) or not can_leave(node, job, waiting))
                )
            )
        ]
        reserved = 0
        for job in firm:
            for uuid in job.gpu_uuids:
                node.claimed[uuid] = job.id
            reserved += node.size[job.id]
            if computing(job, waiting):
                runs[job.id] = job.gpu_uuids
                if not can_leave(node, job, waiting):
                    notes[job.id] = "not time-sliced: it can neither park, stop nor checkpoint"

        def rank(job: JobView) -> tuple[bool, float, bool, int]:
            busy = computing(job, waiting)
            first = busy and not node.over  # room for all: the waiting come back first
            return (first, -self._owed(job.id), busy, job.id)

        ordered = sorted((job for job in node.members if job not in firm), key=rank)
        capacity = len(node.gpus)
        unplaced: list[JobView] = []
        for job in ordered:
            size = node.size[job.id]
            if reserved + size > capacity or waiting.get(job.id, Waiting()).saved:
                continue
            target = None if job.gpu_uuids else self._target(node, job, waiting)
            if job.gpu_uuids:  # at its turn's end, or pinned: only on its own GPUs
                if any(uuid in node.claimed for uuid in job.gpu_uuids):
                    continue
                if not fits_beside_exiting(node, job, waiting):
                    continue
                for uuid in job.gpu_uuids:
                    node.claimed[uuid] = job.id
                runs[job.id] = job.gpu_uuids
            elif (
                target is not None
            ):  # moving: to the GPUs of the job it heads for, at its turn's end
                if any(uuid in node.claimed for uuid in target):
                    continue
                for uuid in target:
                    node.claimed[uuid] = job.id
                runs[job.id] = target
                del self.heading[job.id]
            else:
                unplaced.append(job)
            reserved += size
        for job in unplaced:
            uuids = place(node, job, waiting)
            if uuids is None:
                notes[job.id] = "time-sliced: no GPU has room for its memory beside the others'"
                continue
            for uuid in uuids:
                node.claimed[uuid] = job.id
            runs[job.id] = uuids
        return runs

    def _target(
        self, node: SlicedNode, job: JobView, waiting: Mapping[int, Waiting]
    ) -> tuple[str, ...] | None:
        """The GPUs a moving job heads for, while the job holding them is still there.

        None (and the heading is forgotten) once that job has left them, or
        when they do not suit the moving job (its GPU count, its memory).
        """
        ahead = self.heading.get(job.id)
        if ahead is None:
            return None
        holder = next((m for m in node.members if m.id == ahead), None)
        if holder is None or len(holder.gpu_uuids) != node.size[job.id]:
            del self.heading[job.id]
            return None
        if not fits_on(node, job, holder.gpu_uuids, waiting):
            del self.heading[job.id]
            return None
        return holder.gpu_uuids

    def _moves_key(self, job: JobView) -> tuple[int, float]:
        return (self.moved.get(job.id, 0), self._owed(job.id))

    def _leave(
        self,
        node: SlicedNode,
        runs: Mapping[int, tuple[str, ...]],
        waiting: Mapping[int, Waiting],
        modes: dict[int, str],
        notes: dict[int, str],
    ) -> None:
        """Choose how each member computing now but not chosen waits, and say whose turn it is."""
        by_gpu = {uuid: job_id for job_id, uuids in runs.items() for uuid in uuids}
        exiting = {u for job in node.members if saved(job, waiting) for u in job.gpu_uuids}
        idle = [u for u in node.gpus if u not in node.claimed and u not in exiting]
        for job in node.members:
            if job.id in runs:
                if job.suspended or not job.gpu_uuids:
                    notes[job.id] = f"time-sliced: its turn ({self.quantum:g} s quantum)"
                continue
            if not computing(job, waiting):
                stuck = [
                    other.id
                    for other in node.members
                    if computing(other, waiting) and not can_leave(node, other, waiting)
                ]
                notes[job.id] = "time-sliced: waiting for its turn"
                if job.id in self.heading:
                    notes[job.id] += f", to take job {self.heading[job.id]}'s GPUs"
                if stuck:
                    notes[job.id] += (
                        f"; job {', '.join(map(str, stuck))} cannot take turns (no gpuq.runner "
                        "to park or checkpoint, and GPU memory unknown, so it is not stopped)"
                    )
                continue
            after = sorted({by_gpu[u] for u in job.gpu_uuids if u in by_gpu})
            whose = ", ".join(f"job {j}" for j in after) or "another job"
            owed = self._owed(job.id)
            targeted = set(self.heading.values())
            lone = [j for j in runs if j not in targeted and alone(node, j)]
            ahead = min(lone, key=self._owed, default=None)
            # Of the jobs sharing its GPUs, the one moved least so far moves: restarts are shared.
            partners = sharing(node, job, waiting)
            most = max([owed, *(self._owed(m.id) for m in partners)])
            gap = 0.0 if ahead is None else most - self._owed(ahead)
            turn_to_move = all(self._moves_key(job) <= self._moves_key(m) for m in partners)
            behind = gap > (self.rebalance or 0) and turn_to_move
            mode = wait_mode(node, job, after, waiting, move=behind or bool(idle))
            modes[job.id] = mode
            if mode == "checkpoint" and behind and ahead is not None:
                self.heading[job.id] = ahead
                self.moved[job.id] = self.moved.get(job.id, 0) + 1
            turn = "s'" if len(after) > 1 else "'s"
            notes[job.id] = f"quantum ended, {whose}{turn} turn"
            if mode == "checkpoint" and behind:
                notes[job.id] += f"; it moves: owed {gap:.0f} s more than job {ahead}"
            elif mode == "checkpoint" and idle:
                notes[job.id] += "; it moves: GPUs sit idle"
            elif mode == "checkpoint":
                notes[job.id] += "; no room to park beside the next job"

    def _owed(self, job_id: int) -> float:
        return self.credit.get(job_id, 0.0)

    def _turn_over(self, job_id: int, now: float) -> bool:
        began = self.since.get(job_id)
        return began is None or now - began >= self.quantum - 1e-9

    def save(self) -> dict[str, Any]:
        """The turns, JSON-ready (saved with the policy's memory)."""
        return {
            "version": 1,
            "credit": {str(k): v for k, v in self.credit.items()},
            "since": {str(k): v for k, v in self.since.items()},
            "shares": {str(k): list(v) for k, v in self.shares.items()},
            "rate": {str(k): v for k, v in self.rate.items()},
            "heading": {str(k): v for k, v in self.heading.items()},
            "moved": {str(k): v for k, v in self.moved.items()},
            "last": self.last,
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned (ValueError if it cannot)."""
        if saved.get("version") != 1:
            raise ValueError("unknown slicer memory version")
        try:
            self.credit = {int(k): float(v) for k, v in saved["credit"].items()}
            self.since = {int(k): float(v) for k, v in saved["since"].items()}
            self.shares = {int(k): tuple(int(n) for n in v) for k, v in saved["shares"].items()}
            self.rate = {int(k): float(v) for k, v in saved["rate"].items()}
            self.heading = {int(k): int(v) for k, v in saved.get("heading", {}).items()}
            self.moved = {int(k): int(v) for k, v in saved.get("moved", {}).items()}
            last = saved["last"]
            self.last = None if last is None else float(last)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"damaged slicer memory: {exc}") from exc


def turn_rates(node: SlicedNode, fair: Fairness | None) -> dict[int, float]:
    """Each member's owed part of the node's time (at most 1): G / D, or weighted by shares.

    The rule the simulator applies too (`gpuq.fairshare.turn_shares`).
    """
    members = {job.id: (job.user, node.size[job.id]) for job in node.members}
    return turn_shares(len(node.gpus), members, fair)


def slicer_for(policy: Policy) -> Slicer | None:
    """A slicer for a time-slicing policy, with its quantum; None for any other policy."""
    if not policy.capabilities.time_slicing:
        return None
    return Slicer(quantum=policy.capabilities.quantum)
