"""Gandiva's reactive mode: Algorithm 1 placement, priorities and the limit.

`choose` is Algorithm 1 of the paper (`getNodes`), tried in this order:

1. same affinity, least loaded (lowest height, then lowest index), with room;
2. empty servers: the smallest one that holds the job, else several empty
   servers, largest first (a job bigger than a server);
3. any free GPUs, affinity relaxed: the node with the fewest free GPUs that
   still holds the job (best fit keeps big holes), else GPUs from several
   nodes, most free first (fragmented; locality migration repairs it later);
4. over-subscription: the same-affinity node of least load that has as many
   GPUs as the job, no job of higher priority, and stays within the
   over-subscription limit; its jobs are then time-sliced round-robin (a
   job bigger than a server is never time-sliced: it waits for free GPUs);
5. otherwise the job waits in the queue, unless it can preempt (below).

"Room" counts GPUs that grown jobs would give back (they shrink at once).
The paper's `height(nodes1) < 1` is read as "the node has room for the job"
(taken literally, a ceil(M/N) height is below 1 only on an empty server).
A job with a placement constraint (`JobView.nodes`) is placed, time-sliced
and makes room only on its nodes: every branch considers those alone.

Priorities: a job never over-subscribes a node that holds a higher-priority
job. If it over-subscribes a node of lower-priority jobs, those are suspended
(queued, lowest priority and newest first) until the node is no longer
over-subscribed or only the new job's priority remains; each then tries
Algorithm 1 again, so it moves to another server when that is feasible.
A job that Algorithm 1 would queue instead preempts lower-priority jobs on
the one server where that suspends the fewest GPUs (lowest priority, newest
first; ties to the lowest index), if any server can hold it that way, so a
job that fits on one server never waits for GPUs lower-priority jobs hold.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from gpuq.policies.gandiva.book import Book, eviction_key, queue_key
from gpuq.policies.interface import JobView

BRANCHES = {
    1: "branch 1 (same affinity, least loaded)",
    2: "branch 2 (empty server)",
    3: "branch 3 (free GPUs, affinity relaxed)",
    4: "branch 4 (over-subscribed, time-sliced)",
}
"""What each placement branch of Algorithm 1 means, as used in notes."""

Choice = tuple[int, list[int]]
"""A placement branch and the allocation it gives."""


def _single(book: Book, i: int, gpus: int) -> list[int]:
    allocation = [0] * len(book.nodes)
    allocation[i] = gpus
    return allocation


def _spread(book: Book, order: Iterable[int], room: Callable[[int], int], gpus: int) -> list[int]:
    allocation = [0] * len(book.nodes)
    left = gpus
    for i in order:
        take = min(room(i), left)
        allocation[i] = take
        left -= take
        if not left:
            break
    return allocation


def best_node(book: Book, gpus: int, branch: int, exclude: Iterable[int] = ()) -> int | None:
    """The single node that placement branch 1, 2 or 3 would pick for `gpus` GPUs."""
    skip = set(exclude)
    nodes = [i for i in range(len(book.nodes)) if i not in skip]
    if branch == 1:
        same = [i for i in nodes if book.affinity[i] == gpus and book.available(i) >= gpus]
        return min(same, key=lambda i: (book.height(i), i), default=None)
    if branch == 2:
        empty = [i for i in nodes if not book.residents[i] and book.nodes[i].gpus >= gpus]
        return min(empty, key=lambda i: (book.nodes[i].gpus, i), default=None)
    room = [i for i in nodes if book.available(i) >= gpus]
    return min(room, key=lambda i: (book.available(i), book.height(i), i), default=None)


def choose(book: Book, job: JobView) -> Choice | None:
    """Algorithm 1: the branch and allocation for a waiting job, or None to queue it."""
    gpus = job.gpus_requested
    barred = book.barred(job.id)
    nodes = [i for i in range(len(book.nodes)) if i not in barred]
    for branch in (1, 2):
        i = best_node(book, gpus, branch, barred)
        if i is not None:
            return branch, _single(book, i, gpus)
    empty = [i for i in nodes if not book.residents[i]]
    if sum(book.nodes[i].gpus for i in empty) >= gpus:
        order = sorted(empty, key=lambda i: (-book.nodes[i].gpus, i))
        return 2, _spread(book, order, lambda i: book.nodes[i].gpus, gpus)
    i = best_node(book, gpus, 3, barred)
    if i is not None:
        return 3, _single(book, i, gpus)
    if sum(book.available(i) for i in nodes) >= gpus:
        order = sorted(nodes, key=lambda i: (-book.available(i), i))
        return 3, _spread(book, order, book.available, gpus)
    over = [
        i
        for i in nodes
        if book.affinity[i] == gpus
        and book.nodes[i].gpus >= gpus
        and not book.priority_above(i, job.priority)
        and book.demand_from(i, job.priority) + gpus <= book.limit * book.nodes[i].gpus
    ]
    i = min(over, key=lambda i: (book.height(i), i), default=None)
    return None if i is None else (4, _single(book, i, gpus))


def commit(book: Book, job: JobView, choice: Choice) -> list[int]:
    """Apply a placement; return the lower-priority jobs it suspended."""
    branch, allocation = choice
    for i, gpus in enumerate(allocation):
        if gpus:
            book.shrink(i, gpus)
    book.assign(job.id, allocation)
    where = book.placement_text(job.id)
    book.notes[job.id] = f"placed on {where} by {BRANCHES[branch]}"
    if branch != 4:
        return []
    i = book.node_of(job.id)
    book.notes[job.id] = f"placed on {book.node_text(i)} by {BRANCHES[4]}"
    return suspend_lower(book, i, job.priority, f"suspended for higher-priority job {job.id}")


def _victims(book: Book, i: int, job: JobView) -> list[int] | None:
    """Lower-priority jobs to suspend so that `job` fits on node `i`, or None."""
    if book.nodes[i].gpus < job.gpus_requested:
        return None
    lower = {j for j in book.residents[i] if book.jobs[j].priority < job.priority}
    room = book.free(i) + book.reclaimable(i) - max(0, book.used[i] - book.nodes[i].gpus)
    victims: list[int] = []
    for j in sorted(lower, key=lambda j: eviction_key(book.jobs[j])):
        if room >= job.gpus_requested:
            break
        if j in book.host_of:
            continue
        guest = book.partner(j)
        if guest is not None and guest not in lower:
            continue
        victims.extend([j] if guest is None else [j, guest])
        room += book.alloc[j][i] - book.grown(j)
    return victims if room >= job.gpus_requested else None


def preempt(book: Book, job: JobView) -> list[int] | None:
    """Place `job` by suspending the fewest lower-priority GPUs on one node; None if none can."""
    options = []
    barred = book.barred(job.id)
    for i in range(len(book.nodes)):
        if i in barred:
            continue
        victims = _victims(book, i, job)
        if victims is not None:
            options.append((sum(book.alloc[j][i] for j in victims), i, victims))
    if not options:
        return None
    _, i, victims = min(options, key=lambda option: option[:2])
    for victim in victims:
        if victim in book.alloc:
            book.evict(victim, f"suspended for higher-priority job {job.id}")
    book.shrink(i, job.gpus_requested)
    allocation = [0] * len(book.nodes)
    allocation[i] = job.gpus_requested
    book.assign(job.id, allocation)
    book.notes[job.id] = f"placed on {book.nodes[i].name} by preempting lower-priority jobs"
    return victims


def suspend_lower(book: Book, i: int, priority: int, reason: str) -> list[int]:
    """Queue jobs below `priority` on node `i` until it is not over-subscribed."""
    lower = [j for j in book.residents[i] if book.jobs[j].priority < priority]
    suspended = []
    for j in sorted(lower, key=lambda j: eviction_key(book.jobs[j])):
        if not book.over(i):
            break
        if j in book.alloc:
            book.evict(j, reason)
            suspended.append(j)
    return suspended


def enforce_limits(book: Book) -> None:
    """Repair a state that breaks the rules: shrink grown jobs, then suspend jobs.

    A node over the over-subscription limit loses its newest, lowest-priority
    jobs until it is within the limit; an over-subscribed node that mixes
    priorities loses its lower-priority jobs as in `suspend_lower`.
    """
    for i, node in enumerate(book.nodes):
        if book.over(i):
            book.shrink(i)
        while book.used[i] > book.limit * node.gpus:
            counted = [j for j in book.residents[i] if j not in book.host_of]
            victim = min(counted, key=lambda j: eviction_key(book.jobs[j]))
            book.evict(victim, f"{node.name} was over the {book.limit:g}x over-subscription limit")
        if book.over(i):
            top = max(book.jobs[j].priority for j in book.residents[i])
            suspend_lower(book, i, top, f"{node.name} is time-sliced with higher-priority jobs")


def place_pending(book: Book) -> None:
    """Run Algorithm 1 for every job without GPUs, in priority order.

    Jobs of the same size and priority get the same answer until the plan
    changes, so a failed shape is not tried again until then.
    """
    total = sum(node.gpus for node in book.nodes)
    waiting = [(queue_key(job), job.id) for job in book.pending()]
    heapq.heapify(waiting)
    failed: set[tuple[int, int, int, frozenset[int]]] = set()
    while waiting:
        _, job_id = heapq.heappop(waiting)
        job = book.jobs[job_id]
        if job_id in book.alloc:
            continue
        gpus = job.gpus_requested
        if gpus < 1 or gpus > total:
            book.notes[job_id] = f"queued: requests {gpus} GPUs; the cluster has {total}"
            continue
        barred = book.barred(job_id)
        if barred and gpus > sum(n.gpus for i, n in enumerate(book.nodes) if i not in barred):
            mine = ", ".join(n.name for i, n in enumerate(book.nodes) if i not in barred)
            book.notes[job_id] = f"queued: requests {gpus} GPUs; its nodes ({mine}) have fewer"
            continue
        shape = (gpus, job.priority, book.version, barred)
        if shape in failed:
            suspended = None
        else:
            choice = choose(book, job)
            suspended = commit(book, job, choice) if choice else preempt(book, job)
        if suspended is None:
            failed.add(shape)
            if not book.notes.get(job_id, "").startswith("queued"):
                mine = ", ".join(n.name for i, n in enumerate(book.nodes) if i not in barred)
                book.notes[job_id] = (
                    f"queued (branch 5): no free GPUs and no server of affinity {gpus} "
                    f"under the {book.limit:g}x limit"
                    + (f" on its nodes ({mine})" if barred else "")
                )
            continue
        for victim in suspended:
            heapq.heappush(waiting, (queue_key(book.jobs[victim]), victim))
