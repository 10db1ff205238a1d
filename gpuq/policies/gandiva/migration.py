"""Gandiva's migrations: lower the cluster height, then locality, then defrag.

Every move costs the moved job a restart (`restart_penalty` seconds of lost
progress), so a move is made only when it saves the job more time than that:
with W the job's remaining work in seconds of its current placement run
exclusively (`RemainingWork`), a move from rate factor a to b happens iff
W / a > W / b + penalty (and always when W is unknown). Only single-node jobs
that are neither packed nor grown are moved to lower height or defragment.

Lowering height (on every decision, departures included): while some node is
over-subscribed, take the highest one and move one of its time-sliced jobs to
free GPUs on one other node. The job moved is the smallest that alone ends the
over-subscription, else the largest that fits anywhere; ties go to the lowest
priority, then the newest. The target is picked like Algorithm 1 but with
branch 3 before branch 2 (same affinity, then the fullest node with room,
then an empty server), so empty servers stay whole for big jobs. A packed
guest is unpacked where it is once its node has a free GPU, or moved to a
free GPU on another node if that is worth it (its pack rate counts as a).

Locality: a job spread over several nodes moves onto one node with room for
it, the one where it already has the most GPUs (then the fullest, then the
lowest index). Its speed-up b/a comes from its
goodput model (throughput on one node over throughput where it is); without
a model it is assumed to be `ASSUMED_LOCALITY_SPEEDUP` (Gandiva measured
5-47% inter-server slowdowns), so such a job moves iff W > 11 penalties.

Defragmentation (paper section 4.2.2): only when a spread job could
not be consolidated. Take the non-idle node with the most free GPUs, at least
`threshold` of its GPUs (default 0.75: 3 of 4, as in the paper), big enough
for the spread job; move every other job on it to nodes with fewer free GPUs
(best fit), then consolidate the spread job there. It is done only if every
job can move and the spread job saves more than all the moves' penalties;
repeated until no node qualifies or no spread job benefits.

A job with a placement constraint (`JobView.nodes`) moves only to its nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpuq.policies.gandiva.book import Book, eviction_key
from gpuq.policies.gandiva.placement import best_node
from gpuq.policies.interface import JobView

ASSUMED_LOCALITY_SPEEDUP = 1.1
"""Speed-up assumed from consolidating a job onto one node when it has no model."""

RemainingWork = Callable[[int], float | None]
"""Seconds of work a job has left at its current placement run exclusively."""


def worth_moving(
    job_id: int, before: float, after: float, penalty: float, remaining: RemainingWork
) -> bool:
    """True if running at rate factor `after` plus `penalty` beats staying at `before`."""
    work = remaining(job_id)
    if work is None:
        return True
    if before <= 0.0:
        return after > 0.0
    return work / before > work / after + penalty


def move(book: Book, job_id: int, allocation: list[int], note: str) -> None:
    """Migrate the job to `allocation`, taking back grown GPUs there if needed."""
    book.release(job_id)
    for i, gpus in enumerate(allocation):
        if gpus:
            book.shrink(i, gpus)
    book.assign(job_id, allocation)
    book.notes[job_id] = note


def _single(book: Book, i: int, gpus: int) -> list[int]:
    allocation = [0] * len(book.nodes)
    allocation[i] = gpus
    return allocation


def _movable(book: Book, job_id: int, i: int) -> bool:
    return book.nodes_of(job_id) == [i] and not book.packed(job_id) and job_id not in book.base


def _target(book: Book, gpus: int, src: int, job_id: int) -> int | None:
    for branch in (1, 3, 2):
        i = best_node(book, gpus, branch, exclude=(src, *book.barred(job_id)))
        if i is not None:
            return i
    return None


def _mover_order(book: Book, job_id: int, excess: int) -> tuple[int, int, tuple[int, float, int]]:
    gpus = book.gpus(job_id)
    ends = gpus >= excess
    return (0 if ends else 1, gpus if ends else -gpus, eviction_key(book.jobs[job_id]))


def _lower_once(book: Book, penalty: float, remaining: RemainingWork) -> bool:
    over = sorted((i for i in range(len(book.nodes)) if book.over(i)), key=book.height)
    for src in reversed(over):
        excess = book.used[src] - book.nodes[src].gpus
        movers = [j for j in book.residents[src] if _movable(book, j, src)]
        for job_id in sorted(movers, key=lambda j: _mover_order(book, j, excess)):
            gpus = book.gpus(job_id)
            target = _target(book, gpus, src, job_id)
            if target is None:
                continue
            if not worth_moving(job_id, book.share(job_id), 1.0, penalty, remaining):
                continue
            text = f"migrated {book.node_text(src)} -> {book.nodes[target].name}"
            move(book, job_id, _single(book, target, gpus), f"{text}: lowers cluster height")
            return True
    return False


def lower_height(book: Book, penalty: float, remaining: RemainingWork) -> None:
    """Move time-sliced jobs to free GPUs elsewhere while that lowers height."""
    while _lower_once(book, penalty, remaining):
        pass


def dissolve_packs(
    book: Book,
    penalty: float,
    remaining: RemainingWork,
    pack_rate: Callable[[int], float],
    migrate: bool = True,
) -> None:
    """Unpack guests that a free GPU can take, in place or (if `migrate`) on another node."""
    for guest in sorted(book.host_of):
        i = book.node_of(guest)
        if book.free(i) >= 1:
            book.unpack(guest)
            book.notes[guest] = f"unpacked on {book.nodes[i].name}: a GPU is free"
            continue
        target = _target(book, 1, i, guest) if migrate else None
        before = book.share(guest) * pack_rate(guest)
        if target is not None and worth_moving(guest, before, 1.0, penalty, remaining):
            text = f"unpacked and migrated {book.nodes[i].name} -> {book.nodes[target].name}"
            move(book, guest, _single(book, target, 1), f"{text}: a GPU is free")


def _spread_jobs(book: Book) -> list[int]:
    biggest = max((node.gpus for node in book.nodes), default=0)
    spread = [
        j
        for j in book.alloc
        if len(book.nodes_of(j)) > 1 and not book.packed(j) and book.gpus(j) <= biggest
    ]
    return sorted(spread, key=lambda j: (-len(book.nodes_of(j)), -book.gpus(j), j))


def locality_speedup(job: JobView, gpus: int, spanned: int) -> float:
    """How much faster the job runs on one node than spread over `spanned` nodes."""
    if spanned <= 1:
        return 1.0
    model = job.goodput
    if model is None:
        return ASSUMED_LOCALITY_SPEEDUP
    local_bsz = max(1, math.ceil(max(job.batch_size, job.init_batch_size, 1) / gpus))
    spread = model.throughput(spanned, gpus, local_bsz, 0)
    together = model.throughput(1, gpus, local_bsz, 0)
    if not (spread > 0.0 and math.isfinite(spread) and math.isfinite(together)):
        return ASSUMED_LOCALITY_SPEEDUP
    return together / spread


def _speedup(book: Book, job_id: int) -> float:
    job = book.jobs[job_id]
    return locality_speedup(job, book.gpus(job_id), len(book.nodes_of(job_id)))


def consolidate(book: Book, penalty: float, remaining: RemainingWork) -> list[int]:
    """Move spread jobs onto one node where they fit; return those that could not."""
    left = []
    for job_id in _spread_jobs(book):
        gpus = book.gpus(job_id)
        own = book.alloc[job_id]
        barred = book.barred(job_id)
        room = [
            i
            for i, node in enumerate(book.nodes)
            if node.gpus >= gpus and book.available(i) + own[i] >= gpus and i not in barred
        ]
        if not room:
            left.append(job_id)
            continue
        i = min(room, key=lambda i: (-own[i], book.available(i) + own[i], i))
        if worth_moving(job_id, book.share(job_id), _speedup(book, job_id), penalty, remaining):
            text = f"migrated {book.placement_text(job_id)} -> {book.nodes[i].name}"
            move(book, job_id, _single(book, i, gpus), f"{text}: locality")
    return left


def _defrag_moves(book: Book, src: int, movers: list[int]) -> dict[int, int] | None:
    free = [book.free(i) for i in range(len(book.nodes))]
    limit = free[src]
    moves = {}
    for job_id in sorted(movers, key=lambda j: (-book.gpus(j), j)):
        gpus = book.gpus(job_id)
        barred = book.barred(job_id)
        room = [
            i for i in range(len(free)) if i != src and gpus <= free[i] < limit and i not in barred
        ]
        if not room:
            return None
        target = min(room, key=lambda i: (free[i], i))
        free[target] -= gpus
        moves[job_id] = target
    return moves


def defragment(book: Book, threshold: float, penalty: float, remaining: RemainingWork) -> None:
    """Empty lightly used nodes into fuller ones so that spread jobs can consolidate."""
    for _ in book.nodes:
        spread = consolidate(book, penalty, remaining)
        sources = [
            i
            for i, node in enumerate(book.nodes)
            if book.residents[i] and book.free(i) >= math.ceil(threshold * node.gpus)
        ]
        sources.sort(key=lambda i: (-book.free(i), i))
        done = False
        for src in sources:
            for job_id in spread:
                if book.nodes[src].gpus < book.gpus(job_id) or src in book.barred(job_id):
                    continue
                movers = [j for j in book.residents[src] if j != job_id]
                moves = _defrag_moves(book, src, movers)
                if moves is None or not all(_movable(book, j, src) for j in movers):
                    continue
                cost = penalty * (1 + len(movers))
                faster = _speedup(book, job_id)
                if not worth_moving(job_id, book.share(job_id), faster, cost, remaining):
                    continue
                for mover, target in moves.items():
                    text = f"migrated {book.nodes[src].name} -> {book.nodes[target].name}"
                    gpus = book.gpus(mover)
                    move(book, mover, _single(book, target, gpus), f"{text}: defragment")
                gpus = book.gpus(job_id)
                text = f"migrated {book.placement_text(job_id)} -> {book.nodes[src].name}"
                move(book, job_id, _single(book, src, gpus), f"{text}: locality after defrag")
                done = True
                break
            if done:
                break
        if not done:
            return
