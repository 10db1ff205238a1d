"""Moves on one server: which running jobs to move to other GPUs so a waiting job gets its own.

A move checkpoints a running job and restarts it on other GPUs of the same
node, with the same count and the same shape (a whole GPU stays whole, a
memory share keeps its size). It costs the job a restart, so a policy moves
jobs only when that gives a waiting job GPUs it cannot get otherwise. Two
kinds, each with the reason the moved job's note carries:

Free GPUs (`free_gpus`)
    Memory-share jobs scattered one per GPU block a job that needs whole
    GPUs (or a larger share than any GPU has left). Share jobs are moved
    onto other GPUs that already hold shares (best fit: the least memory
    left that still fits, ties in GPU order), emptying first the GPUs that
    cost the fewest moves (then the least memory to move, then GPU order),
    until the waiting job fits: "frees GPU 0 for job 9".

Gather (`gather`)
    A multi-GPU job that needs whole GPUs would get GPUs of several link
    groups (PCIe switches or NVLink groups, `gpuq.policies.topology`),
    while single-GPU jobs hold GPUs of a group big enough for it. Those
    jobs are moved to free GPUs outside the group (taking first the free
    GPUs of groups with the fewest free, so free groups stay whole), and
    the job gets GPUs of one group: "frees GPU 1 for job 9, so that its 2
    GPUs share a PCIe switch or NVLink". The group chosen needs the fewest
    moves (then is the smallest, then comes first).

Rules for every move:

- only a `movable` job is moved: it holds GPUs and is not suspended, the
  caller can checkpoint it (`JobView.preemptible`), it has one GPU and no
  packing partner, and it has run `settle` seconds since it started and
  since it was last moved (`JobView.moved_at`): no job is moved twice in
  quick succession;
- all or nothing: moves are proposed only if, once made, the waiting job
  fits (checked on a copy of the capacity), so no job is moved for
  nothing; the plan says which GPUs the waiting job then gets;
- GPU positions are indices into `state.gpus`; a move never leaves its node;
- the waiting job gets GPUs only of the nodes it may use (`JobView.nodes`).

Pure: no I/O; `fifo` calls it for the first job of its queue that needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuq.policies.interface import ClusterState, JobView
from gpuq.policies.placement import Capacity, Hold
from gpuq.policies.topology import gpus_label, spans

_LINK = "PCIe switch or NVLink"
DEFAULT_SETTLE = 60.0
"""Seconds a job runs (since it started or was last moved) before it may be moved."""


@dataclass(frozen=True, slots=True)
class Move:
    """Job `job_id` goes from GPUs `source` to `target` (positions), with the reason's note."""

    job_id: int
    source: tuple[int, ...]
    target: tuple[int, ...]
    note: str


@dataclass(frozen=True, slots=True)
class MovePlan:
    """Moves that make room for a waiting job, and the GPUs it then gets.

    `capacity` is the capacity after the moves, before the waiting job is
    placed on `gpus`.
    """

    moves: tuple[Move, ...]
    gpus: tuple[int, ...]
    capacity: Capacity


def movable(job: JobView, now: float, settle: float) -> bool:
    """True when a policy may move `job` now (module docstring)."""
    if not job.gpu_uuids or job.suspended or not job.preemptible or job.packed_with:
        return False
    if len(job.gpu_uuids) != 1:
        return False
    since = max(job.start_time, job.moved_at if job.moved_at is not None else job.start_time)
    return now - since >= settle


def _holders(state: ClusterState, capacity: Capacity) -> dict[int, list[JobView]]:
    """The running jobs of the state on each GPU (position)."""
    on: dict[int, list[JobView]] = {}
    for job in state.jobs:
        for uuid in job.gpu_uuids:
            position = capacity.index.get(uuid)
            if position is not None:
                on.setdefault(position, []).append(job)
    return on


def _shared_target(capacity: Capacity, node: str, gpu_mem: int, excluded: set[int]) -> int | None:
    """The GPU of `node` already holding shares where `gpu_mem` fits tightest, if any."""
    best: tuple[int, int] | None = None
    for i, usable in enumerate(capacity.usable):
        if i in excluded or capacity.nodes[i] != node:
            continue
        if capacity.owners[i] or not capacity.sharers[i]:
            continue
        free = usable - capacity.shares[i]
        if free >= gpu_mem and (best is None or (free, i) < best):
            best = (free, i)
    return None if best is None else best[1]


def free_gpus(
    state: ClusterState, capacity: Capacity, waiting: JobView, now: float, settle: float
) -> MovePlan | None:
    """Moves of share jobs that empty GPUs until `waiting` fits, or None (module docstring)."""
    if waiting.gpus_requested <= 0:
        return None
    outside = capacity.outside(waiting)
    holders = _holders(state, capacity)
    candidates: list[tuple[int, int, int]] = []
    for i, jobs in holders.items():
        if i in outside:
            continue  # freeing it would not help: the waiting job may not use it
        if capacity.owners[i] or capacity.sharers[i] != len(jobs):
            continue  # a whole-GPU job, or a share placed in this pass, is there
        if not all(job.gpu_mem is not None and movable(job, now, settle) for job in jobs):
            continue
        if waiting.gpu_mem is None and not capacity.whole_ok[i]:
            continue  # other users' memory keeps it from ever being a free GPU
        candidates.append((len(jobs), sum(job.gpu_mem or 0 for job in jobs), i))
    candidates.sort()
    trial = capacity.copy()
    emptied: list[int] = []
    received: set[int] = set()
    planned: list[tuple[JobView, int, int]] = []
    for _, _, source in candidates:
        if source in received:
            continue
        attempt = trial.copy()
        moves: list[tuple[JobView, int, int]] = []
        blocked = {source, *emptied}
        for job in sorted(holders[source], key=lambda j: (-(j.gpu_mem or 0), j.id)):
            gpu_mem = job.gpu_mem or 0
            attempt.release(Hold(job.id, (source,), gpu_mem))
            target = _shared_target(attempt, capacity.nodes[source], gpu_mem, blocked)
            if target is None:
                break
            attempt.hold(Hold(job.id, (target,), gpu_mem))
            moves.append((job, source, target))
        else:
            trial = attempt
            emptied.append(source)
            received.update(target for _, _, target in moves)
            planned.extend(moves)
            gpus = trial.choose(
                waiting.gpus_requested, waiting.gpu_mem, waiting.exclusive, outside, waiting.spread
            )
            if gpus is not None:
                freed = gpus_label(state, sorted(set(gpus) & set(emptied)) or emptied)
                note = f"frees {freed} for job {waiting.id}"
                made = tuple(Move(job.id, (s,), (t,), note) for job, s, t in planned)
                return MovePlan(made, gpus, trial)
    return None


def gather(
    state: ClusterState,
    capacity: Capacity,
    waiting: JobView,
    gpus: tuple[int, ...],
    now: float,
    settle: float,
) -> MovePlan | None:
    """Moves that give `waiting` GPUs of one link group instead of `gpus`, or None (docstring)."""
    count = waiting.gpus_requested
    keys = capacity.groups
    if count < 2 or waiting.gpu_mem is not None or spans(keys, gpus) <= 1:
        return None
    holders = _holders(state, capacity)

    def free(i: int) -> bool:
        return not capacity.owners[i] and not capacity.sharers[i] and capacity.whole_ok[i]

    def blocker(i: int) -> JobView | None:
        jobs = holders.get(i, [])
        if capacity.owners[i] != 1 or capacity.sharers[i] or len(jobs) != 1:
            return None
        job = jobs[0]
        whole = job.gpu_mem is None or job.exclusive
        return job if whole and capacity.whole_ok[i] and movable(job, now, settle) else None

    barred = capacity.outside(waiting)
    members: dict[object, list[int]] = {}
    for i, gpu in enumerate(state.gpus):
        if gpu.link_group and i not in barred:
            members.setdefault(keys[i], []).append(i)
    best: tuple[tuple[int, int, int], list[tuple[int, JobView]], list[int]] | None = None
    for group in members.values():
        if len(group) < count:
            continue
        node = capacity.nodes[group[0]]
        inside = [i for i in group if free(i)]
        movers = [(i, job) for i in group if (job := blocker(i)) is not None]
        need = count - len(inside)
        outside = [
            i
            for i in range(len(keys))
            if capacity.nodes[i] == node and keys[i] != keys[group[0]] and free(i)
        ]
        if need <= 0 or len(movers) < need or len(outside) < need:
            continue
        rank = (need, len(group), group[0])
        if best is None or rank < best[0]:
            best = (rank, movers[:need], outside)
    if best is None:
        return None
    _, sources, outside = best
    free_per_group: dict[object, int] = {}
    for i in outside:
        free_per_group[keys[i]] = free_per_group.get(keys[i], 0) + 1
    targets = sorted(outside, key=lambda i: (free_per_group[keys[i]], i))[: len(sources)]
    trial = capacity.copy()
    for (source, job), target in zip(sources, targets, strict=True):
        trial.release(Hold(job.id, (source,), job.gpu_mem, job.exclusive))
        trial.hold(Hold(job.id, (target,), job.gpu_mem, job.exclusive))
    chosen = trial.choose(count, None, waiting.exclusive, barred, waiting.spread)
    if chosen is None or spans(keys, chosen) != 1:
        return None
    freed = gpus_label(state, [source for source, _ in sources])
    note = f"frees {freed} for job {waiting.id}, so that its {count} GPUs share a {_LINK}"
    made = tuple(
        Move(job.id, (source,), (target,), note)
        for (source, job), target in zip(sources, targets, strict=True)
    )
    return MovePlan(made, chosen, trial)


__all__ = ["DEFAULT_SETTLE", "Move", "MovePlan", "free_gpus", "gather", "movable"]
