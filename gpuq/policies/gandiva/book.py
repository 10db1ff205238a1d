"""Gandiva's cluster bookkeeping: server height, affinity, and a mutable plan.

`Book` is the working copy of the cluster that one `GandivaPolicy.decide`
call edits: each job's planned allocation, each node's demand, affinity and
residents, packed pairs, GPUs grown beyond a request, and the note per job.
It is built from the (immutable) `ClusterState` and never writes back to it.

Accounting rules (see `gpuq.policies.gandiva.policy` for the policy itself):

- A node's *demand* is the sum of its residents' allocations, except that a
  packed guest shares its host's GPU and adds nothing. `height = demand /
  GPUs` (a ratio; Gandiva's ceil(M/N) exceeds 1 exactly when the ratio does).
- *Free* GPUs are `GPUs - demand` (never negative); *reclaimable* GPUs are
  those opt-in jobs hold beyond their request (grow-shrink), which a job that
  needs GPUs takes back before anything else happens to it.
- *Affinity* is set to a job's requested GPU count when it is placed on an
  empty node and reset to 0 when the node empties.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuq.policies.interface import ClusterState, JobView, NodeView


def node_demands(state: ClusterState, packed: Iterable[Iterable[int]] = ()) -> list[int]:
    """GPUs allocated on each node, counting each packed group's shared GPUs once."""
    guests = {job_id for group in packed for job_id in sorted(group)[1:]}
    demands = [0] * len(state.nodes)
    for job in state.jobs:
        if job.id in guests or len(job.allocation) != len(state.nodes):
            continue
        for i, count in enumerate(job.allocation):
            demands[i] += max(0, count)
    return demands


def server_heights(state: ClusterState, packed: Iterable[Iterable[int]] = ()) -> list[float]:
    """Each server's height: allocated over total GPUs (inf for a loaded 0-GPU node)."""
    return [
        _ratio(demand, node.gpus)
        for demand, node in zip(node_demands(state, packed), state.nodes, strict=True)
    ]


def cluster_height(state: ClusterState, packed: Iterable[Iterable[int]] = ()) -> float:
    """The cluster's height: the largest server height (0 for no servers)."""
    return max(server_heights(state, packed), default=0.0)


def overloaded(state: ClusterState) -> bool:
    """True when the active jobs request more GPUs than the cluster has."""
    return sum(job.gpus_requested for job in state.jobs) > state.total_gpus


def _ratio(demand: int, gpus: int) -> float:
    if gpus > 0:
        return demand / gpus
    return math.inf if demand else 0.0


def queue_key(job: JobView) -> tuple[int, float, int]:
    """Scheduling order: priority high first, then submit time, then id."""
    return (-job.priority, job.submit_time, job.id)


def eviction_key(job: JobView) -> tuple[int, float, int]:
    """Who yields first: lowest priority, then latest submitted, then highest id."""
    return (job.priority, -job.submit_time, -job.id)


@dataclass(slots=True)
class Book:
    """The plan under construction: allocations, demand, affinity, packs, notes."""

    nodes: tuple[NodeView, ...]
    jobs: dict[int, JobView]
    limit: float
    alloc: dict[int, list[int]] = field(default_factory=dict)
    residents: list[set[int]] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    affinity: list[int] = field(default_factory=list)
    host_of: dict[int, int] = field(default_factory=dict)
    base: dict[int, int] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)
    version: int = 0

    @classmethod
    def from_state(
        cls,
        state: ClusterState,
        limit: float,
        affinity: Mapping[str, int],
        packs: Mapping[int, int],
        opt_in: Callable[[JobView], bool],
    ) -> Book:
        """Load the running jobs, remembered packs and affinities into a new plan."""
        count = len(state.nodes)
        book = cls(state.nodes, {job.id: job for job in state.jobs}, limit)
        book.residents = [set() for _ in range(count)]
        book.used = [0] * count
        book.affinity = [0] * count
        for job in state.jobs:
            allocation = job.allocation
            if count and len(allocation) == count and min(allocation) >= 0 and sum(allocation) > 0:
                book.alloc[job.id] = list(allocation)
                for i, gpus in enumerate(allocation):
                    if gpus:
                        book.residents[i].add(job.id)
                        book.used[i] += gpus
                spans = sum(1 for gpus in allocation if gpus)
                if opt_in(job) and spans == 1 and sum(allocation) > job.gpus_requested >= 1:
                    book.base[job.id] = job.gpus_requested
        for guest, host in sorted(packs.items()):
            if guest in book.alloc and book.can_pair(guest, host):
                if book.alloc[guest] != book.alloc[host]:
                    continue
                book.host_of[guest] = host
                book.used[book.node_of(guest)] -= 1
        for i, node in enumerate(state.nodes):
            if book.residents[i]:
                first = min(book.residents[i], key=lambda j: (book.jobs[j].submit_time, j))
                book.affinity[i] = affinity.get(node.name) or book.jobs[first].gpus_requested
        return book

    # Queries.

    def barred(self, job_id: int) -> frozenset[int]:
        """The nodes (indices) the job may not use: its placement constraint (`JobView.nodes`)."""
        job = self.jobs.get(job_id)
        if job is None or job.nodes is None:
            return frozenset()
        return frozenset(i for i, node in enumerate(self.nodes) if node.name not in job.nodes)

    def free(self, i: int) -> int:
        """GPUs of node `i` no job holds."""
        return max(0, self.nodes[i].gpus - self.used[i])

    def reclaimable(self, i: int) -> int:
        """GPUs grown jobs on node `i` hold beyond their request."""
        return sum(self.grown(j) for j in self.base if j in self.residents[i])

    def available(self, i: int) -> int:
        """GPUs a job that needs them can get on node `i` without over-subscribing it."""
        return self.free(i) + self.reclaimable(i)

    def height(self, i: int) -> float:
        """Node `i`'s height: demand over GPUs."""
        return _ratio(self.used[i], self.nodes[i].gpus)

    def over(self, i: int) -> bool:
        """True if node `i` is over-subscribed, so its jobs are time-sliced."""
        return self.used[i] > self.nodes[i].gpus

    def grown(self, job_id: int) -> int:
        """GPUs an opt-in job holds beyond its request (0 if it has not grown)."""
        base = self.base.get(job_id)
        return sum(self.alloc[job_id]) - base if base is not None else 0

    def gpus(self, job_id: int) -> int:
        """GPUs the job holds in the plan (0 if it holds none)."""
        return sum(self.alloc.get(job_id, ()))

    def nodes_of(self, job_id: int) -> list[int]:
        """Indices of the nodes the job holds GPUs on."""
        return [i for i, gpus in enumerate(self.alloc.get(job_id, ())) if gpus]

    def node_of(self, job_id: int) -> int:
        """The node of a single-node job (the first of its nodes otherwise)."""
        return self.nodes_of(job_id)[0]

    def packed(self, job_id: int) -> bool:
        """True if the job is a packed guest or host."""
        return job_id in self.host_of or job_id in self.host_of.values()

    def partner(self, job_id: int) -> int | None:
        """The other job of the job's packed pair, if any."""
        if job_id in self.host_of:
            return self.host_of[job_id]
        return next((g for g, h in self.host_of.items() if h == job_id), None)

    def can_pair(self, guest: int, host: int) -> bool:
        """True if both hold exactly one GPU on one node and neither is packed."""
        if guest == host or self.packed(guest) or self.packed(host):
            return False
        return self.gpus(host) == 1 and self.gpus(guest) in (0, 1)

    def share(self, job_id: int) -> float:
        """The fraction of its rate the job gets from round-robin time-slicing."""
        return min(
            (min(1.0, self.nodes[i].gpus / self.used[i]) for i in self.nodes_of(job_id)),
            default=0.0,
        )

    def priority_above(self, i: int, priority: int) -> bool:
        """True if node `i` hosts a job of higher priority than `priority`."""
        return any(self.jobs[j].priority > priority for j in self.residents[i])

    def demand_from(self, i: int, priority: int) -> int:
        """Node `i`'s demand from jobs of priority `priority` or higher."""
        return sum(
            self.alloc[j][i]
            for j in self.residents[i]
            if j not in self.host_of and self.jobs[j].priority >= priority
        )

    def pending(self) -> list[JobView]:
        """Jobs without GPUs in the plan, in scheduling order."""
        return sorted(
            (job for job in self.jobs.values() if job.id not in self.alloc), key=queue_key
        )

    # Changes.

    def assign(self, job_id: int, allocation: list[int]) -> None:
        """Give the job `allocation` (replacing any other), setting affinity of empty nodes."""
        self.version += 1
        self.release(job_id)
        if not any(allocation):
            return
        self.alloc[job_id] = list(allocation)
        for i, gpus in enumerate(allocation):
            if gpus:
                if not self.residents[i]:
                    self.affinity[i] = self.jobs[job_id].gpus_requested
                self.residents[i].add(job_id)
                self.used[i] += gpus

    def release(self, job_id: int) -> None:
        """Take the job's GPUs away; its packed partner, if any, is unpacked."""
        self.version += 1
        partner = self.partner(job_id)
        if partner is not None:
            self.unpack(job_id if job_id in self.host_of else partner)
        for i, gpus in enumerate(self.alloc.pop(job_id, ())):
            if gpus:
                self.residents[i].discard(job_id)
                self.used[i] -= gpus
                if not self.residents[i]:
                    self.affinity[i] = 0

    def pack(self, guest: int, host: int) -> None:
        """Run `guest` on `host`'s GPU at the same time (it adds no demand)."""
        self.assign(guest, list(self.alloc[host]))
        self.host_of[guest] = host
        self.used[self.node_of(host)] -= 1

    def unpack(self, guest: int) -> None:
        """Dissolve the guest's pack; it stays on its node and is time-sliced if needed."""
        self.version += 1
        del self.host_of[guest]
        self.used[self.node_of(guest)] += 1

    def resize(self, job_id: int, i: int, gpus: int) -> None:
        """Set the job's GPUs on node `i` (grow-shrink), keeping the node's affinity."""
        self.version += 1
        self.used[i] += gpus - self.alloc[job_id][i]
        self.alloc[job_id][i] = gpus
        total = sum(self.alloc[job_id])
        if total <= self.base.get(job_id, total):
            self.base.pop(job_id, None)

    def shrink(self, i: int, needed: int = 0) -> None:
        """Take GPUs back from grown jobs on node `i` until `needed` more fit in it."""
        for job_id in sorted(self.residents[i], key=lambda j: eviction_key(self.jobs[j])):
            extra = min(self.grown(job_id), self.used[i] + needed - self.nodes[i].gpus)
            if extra > 0:
                self.resize(job_id, i, self.alloc[job_id][i] - extra)
                total = sum(self.alloc[job_id])
                self.notes[job_id] = f"shrunk to {total} GPUs: another job needs them"

    def evict(self, job_id: int, reason: str) -> None:
        """Suspend the job: it holds no GPUs and waits in the queue."""
        self.release(job_id)
        self.base.pop(job_id, None)
        self.notes[job_id] = f"queued: {reason}"

    def node_text(self, i: int) -> str:
        """A node's name with its demand, e.g. 'n1 (6 GPUs of 4)'."""
        return f"{self.nodes[i].name} ({self.used[i]} GPUs of {self.nodes[i].gpus})"

    def placement_text(self, job_id: int) -> str:
        """Where the job runs, e.g. 'n1' or 'n1+n3'."""
        return "+".join(self.nodes[i].name for i in self.nodes_of(job_id))
