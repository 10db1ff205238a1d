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
- **Packs**: a packed group (`Decision.packed`) takes turns as one job: its
  anchor (`gpuq.daemon.scheduler.packs.anchor_of`) is sliced, and the others
  compute on its GPUs in its turns and wait with it.
- **Pins**: a parked or stopped job can compute again only on the GPUs it
  holds. Pins alone would fix each GPU's share by how many jobs it holds (six
  jobs on four GPUs: two GPUs of two jobs and two of one), so a job leaving
  its GPUs is checkpointed instead of parked, to take other GPUs at their
  next turn, when a job computing elsewhere is owed `rebalance` seconds
  less than it, or when GPUs of the node sit idle.

What it remembers (each job's credit, its turn's start, the jobs it
checkpointed for their turn and their share of the node) is saved with the
policy's memory, so a restart keeps the turns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuq.daemon.scheduler.packs import guests_of
from gpuq.policies.interface import ClusterState, Decision, JobView, Policy

REBALANCE_QUANTA = 4
"""A job leaving its GPUs moves (checkpoint) when owed this many quanta more than one elsewhere."""
PARK_RESIDENT_BYTES = 512 * 1024**2
"""GPU memory a parked runner job keeps (its CUDA context) where nothing better is known."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """How one job can wait for its turn, as the caller knows it.

    `modes`: the ways it can leave its GPUs ("park", "checkpoint", "stop");
    `needs`: bytes per GPU it uses while computing (None: unknown);
    `leaving`: a suspend of it is under way (it is neither computing nor waiting yet);
    `resumable`: False for a job its user suspended, which only its user resumes.
    """

    modes: frozenset[str] = frozenset()
    needs: int | None = None
    leaving: bool = False
    resumable: bool = True

    def resident(self, mode: str) -> int:
        """Bytes per GPU the job keeps while it waits in `mode` (park or stop)."""
        if mode == "park":
            return PARK_RESIDENT_BYTES
        return self.needs or 0


@dataclass(frozen=True, slots=True)
class Slices:
    """What to carry out now: `decision` over-subscribes no node; `wake` is the next turn's end."""

    decision: Decision
    wake: float | None = None
    sliced: frozenset[int] = frozenset()


@dataclass(slots=True)
class _Node:
    """One sliced node's pass: its GPUs, members, and what is claimed.

    `over` is False for a node no longer over-subscribed whose jobs still
    wait from their last turns: they are brought back first.
    """

    index: int
    gpus: tuple[str, ...]
    usable: dict[str, int]
    members: list[JobView]
    size: dict[int, int]
    over: bool = True
    claimed: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Slicer:
    """Turns on over-subscribed nodes; see the module docstring."""

    quantum: float = 60.0
    rebalance: float | None = None
    credit: dict[int, float] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)
    shares: dict[int, tuple[int, ...]] = field(default_factory=dict)
    rate: dict[int, float] = field(default_factory=dict)
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
        self.shares = {j: decision.allocations[j] for j in sorted(sliced)}
        self.rate = {}
        allocations = {j: a for j, a in decision.allocations.items() if j not in sliced}
        bindings = {j: b for j, b in decision.bindings.items() if j not in sliced}
        modes = dict(decision.suspend_modes)
        notes = dict(decision.notes)
        ends: list[float] = []
        for node in nodes:
            demand = sum(node.size.values())
            for job in node.members:
                self.credit.setdefault(job.id, 0.0)
                self.rate[job.id] = min(1.0, len(node.gpus) / demand)
            runs = self._turns(node, waiting, now, notes)
            for job_id, uuids in runs.items():
                allocations[job_id] = decision.allocations[job_id]
                bindings[job_id] = uuids
                if not _computing(jobs[job_id], waiting) or self._turn_over(job_id, now):
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
        if _computing(guest, waiting):
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
                    ran = dt if _computing(job, waiting) else 0.0
                    self.credit[job_id] = self.credit.get(job_id, 0.0) + dt * rate - ran
        self.last = now if self.last is None else max(self.last, now)

    def _oversubscribed(
        self,
        state: ClusterState,
        decision: Decision,
        jobs: Mapping[int, JobView],
        guests: Mapping[int, int],
    ) -> list[_Node]:
        """The nodes to slice, with their one-node jobs.

        Those the decision gives more GPUs than they have, and those whose jobs
        still wait from their last turns (`_Node.over`). A packed guest adds
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
            found.append(_Node(index, uuids, usable, members, size, over))
        return found

    def _turns(
        self,
        node: _Node,
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
            and (
                waiting.get(job.id, Waiting()).leaving
                or not waiting.get(job.id, Waiting()).resumable
                or (
                    _computing(job, waiting)
                    and (
                        not self._turn_over(job.id, now) or not self._can_leave(node, job, waiting)
                    )
                )
            )
        ]
        reserved = 0
        for job in firm:
            for uuid in job.gpu_uuids:
                node.claimed[uuid] = job.id
            reserved += node.size[job.id]
            if _computing(job, waiting):
                runs[job.id] = job.gpu_uuids
                if not self._can_leave(node, job, waiting):
                    notes[job.id] = "not time-sliced: it can neither park, stop nor checkpoint"

        def rank(job: JobView) -> tuple[bool, float, bool, int]:
            computing = _computing(job, waiting)
            first = computing and not node.over  # room for all: the waiting come back first
            return (first, -self._owed(job.id), computing, job.id)

        ordered = sorted((job for job in node.members if job not in firm), key=rank)
        capacity = len(node.gpus)
        unplaced: list[JobView] = []
        for job in ordered:
            size = node.size[job.id]
            if reserved + size > capacity:
                continue
            if job.gpu_uuids:  # at its turn's end, or pinned: only on its own GPUs
                if any(uuid in node.claimed for uuid in job.gpu_uuids):
                    continue
                for uuid in job.gpu_uuids:
                    node.claimed[uuid] = job.id
                runs[job.id] = job.gpu_uuids
            else:
                unplaced.append(job)
            reserved += size
        for job in unplaced:
            uuids = self._place(node, job, waiting)
            if uuids is None:
                notes[job.id] = "time-sliced: no GPU has room for its memory beside the others'"
                continue
            for uuid in uuids:
                node.claimed[uuid] = job.id
            runs[job.id] = uuids
        return runs

    def _place(
        self, node: _Node, job: JobView, waiting: Mapping[int, Waiting]
    ) -> tuple[str, ...] | None:
        """Unclaimed GPUs for a job holding none: idle ones first, then the least crowded."""
        size = node.size[job.id]
        pinned: dict[str, int] = {}
        resident: dict[str, int] = {}
        for other in node.members:
            if other.id == job.id:
                continue
            for uuid in other.gpu_uuids:
                pinned[uuid] = pinned.get(uuid, 0) + 1
                resident[uuid] = resident.get(uuid, 0) + _resident(other, waiting)
        needs = waiting.get(job.id, Waiting()).needs or 0
        candidates = [
            u
            for u in node.gpus
            if u not in node.claimed and resident.get(u, 0) + needs <= node.usable.get(u, 0)
        ]
        candidates.sort(key=lambda u: (pinned.get(u, 0), node.gpus.index(u)))
        if len(candidates) < size:
            return None
        return tuple(candidates[:size])

    def _leave(
        self,
        node: _Node,
        runs: Mapping[int, tuple[str, ...]],
        waiting: Mapping[int, Waiting],
        modes: dict[int, str],
        notes: dict[int, str],
    ) -> None:
        """Choose how each member computing now but not chosen waits, and say whose turn it is."""
        by_gpu = {uuid: job_id for job_id, uuids in runs.items() for uuid in uuids}
        idle = [u for u in node.gpus if u not in node.claimed]
        for job in node.members:
            if job.id in runs:
                if job.suspended or not job.gpu_uuids:
                    notes[job.id] = f"time-sliced: its turn ({self.quantum:g} s quantum)"
                continue
            if not _computing(job, waiting):
                stuck = [
                    other.id
                    for other in node.members
                    if _computing(other, waiting) and not self._can_leave(node, other, waiting)
                ]
                notes[job.id] = "time-sliced: waiting for its turn"
                if stuck:
                    notes[job.id] += (
                        f"; job {', '.join(map(str, stuck))} cannot take turns (no gpuq.runner "
                        "to park or checkpoint, and GPU memory unknown, so it is not stopped)"
                    )
                continue
            after = sorted({by_gpu[u] for u in job.gpu_uuids if u in by_gpu})
            whose = ", ".join(f"job {j}" for j in after) or "another job"
            owed = self._owed(job.id)
            others = [self._owed(j) for j in runs if j not in after]
            behind = bool(others) and owed - min(others) > (self.rebalance or 0)
            mode = self._mode(node, job, after, waiting, move=behind or bool(idle))
            modes[job.id] = mode
            turn = "s'" if len(after) > 1 else "'s"
            notes[job.id] = f"quantum ended, {whose}{turn} turn"

    def _mode(
        self,
        node: _Node,
        job: JobView,
        after: list[int],
        waiting: Mapping[int, Waiting],
        move: bool,
    ) -> str:
        """Park, stop or checkpoint (module docstring)."""
        info = waiting.get(job.id, Waiting())
        if move and "checkpoint" in info.modes:
            return "checkpoint"
        incoming = max((waiting.get(j, Waiting()).needs or 0 for j in after), default=0)
        others = [m for m in node.members if m.id != job.id and m.suspended and m.gpu_uuids]
        for mode in ("park", "stop"):
            if mode not in info.modes or (mode == "stop" and info.needs is None):
                continue
            fits = True
            for uuid in job.gpu_uuids:
                kept = sum(_resident(m, waiting) for m in others if uuid in m.gpu_uuids)
                if kept + info.resident(mode) + incoming > node.usable.get(uuid, 0):
                    fits = False
            if fits:
                return mode
        return "checkpoint"

    @staticmethod
    def _can_leave(node: _Node, job: JobView, waiting: Mapping[int, Waiting]) -> bool:
        """True if the job can leave its GPUs for a turn in some mode (module docstring).

        A stop keeps all of the job's memory: it must fit beside the largest
        job of the node and what waiting jobs keep on the same GPUs.
        """
        info = waiting.get(job.id, Waiting())
        if info.modes & {"park", "checkpoint"}:
            return True
        if "stop" not in info.modes or info.needs is None:
            return False
        others = [m for m in node.members if m.id != job.id]
        incoming = max((waiting.get(m.id, Waiting()).needs or 0 for m in others), default=0)
        for uuid in job.gpu_uuids:
            kept = sum(_resident(m, waiting) for m in others if m.suspended and uuid in m.gpu_uuids)
            if kept + info.needs + incoming > node.usable.get(uuid, 0):
                return False
        return True

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
            last = saved["last"]
            self.last = None if last is None else float(last)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"damaged slicer memory: {exc}") from exc


def _computing(job: JobView, waiting: Mapping[int, Waiting]) -> bool:
    """True if the job computes now: it holds GPUs, is not suspended and is not leaving."""
    return bool(job.gpu_uuids) and not job.suspended and not waiting.get(job.id, Waiting()).leaving


def slicer_for(policy: Policy) -> Slicer | None:
    """A slicer for a time-slicing policy, with its quantum; None for any other policy."""
    if not policy.capabilities.time_slicing:
        return None
    return Slicer(quantum=policy.capabilities.quantum)


def _resident(job: JobView, waiting: Mapping[int, Waiting]) -> int:
    """Bytes per GPU a waiting job keeps: a parked runner's context, a stopped job's all."""
    info = waiting.get(job.id, Waiting())
    return info.resident("park" if "park" in info.modes else "stop")
