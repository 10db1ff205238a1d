"""Gandiva (Xiao et al., OSDI '18) as an elastic policy: the `gandiva` policy.

Gandiva gives every arriving job GPUs at once, over-subscribing servers and
time-slicing them when it must, and then keeps improving the cluster:
packing jobs that share a GPU well, migrating jobs to lower server load and
to improve locality, and growing opt-in jobs onto idle GPUs (paper sections
4.1-4.2). Where the paper leaves a choice open it is made here and tested in
tests/test_policy_gandiva.py. Each decision runs, in order:

1. Measure every job's progress rate since the last decision
   (`packing`): the proxy for Gandiva's mini_batch_time.
2. Review packs: keep a pack while it beats time-slicing, else undo it.
3. Repair the state if it breaks the rules (a node over the over-subscription
   limit, or time-slicing jobs of different priorities): lowest priority,
   newest jobs are suspended (queued) first (`placement`).
4. Place waiting jobs by Algorithm 1 in priority order (priority, submit
   time, id): same affinity least loaded, empty servers, any free GPUs,
   over-subscription of a same-affinity server, else preempt lower-priority
   jobs or queue (`placement`).
5. Migrate (if `migration`): lower the cluster height by moving time-sliced
   jobs to free GPUs, unpack guests that a free GPU can take, consolidate
   spread jobs and defragment (`migration`). Each move must save more
   than the restart penalty it costs. Without migration, a guest is unpacked
   only when its own node has a free GPU.
6. Pack (if `packing`, only while overloaded).
7. Grow opt-in jobs onto idle GPUs (if `grow_shrink`).

Bookkeeping (`book`): server height = allocated GPUs
over total (a packed pair's GPU counted once); cluster height = the largest;
overload = the active jobs request more GPUs than the cluster has; a
server's affinity is the requested GPU count of the first job placed on it
while empty and is reset when it empties (remembered between decisions; a
policy that meets a busy server it has not seen uses its oldest job's count).

Time-slicing is expressed by over-subscribed allocations: a job keeps its
node and GPUs across quanta and the caller shares an over-subscribed server
round-robin (each job runs at GPUs/demand of its speed), so suspend-resume
happens only on servers of height above 1. `quantum` is the slice length the
caller should use (60 s, paper section 6); decisions do not depend on it. No
node's demand ever exceeds `oversubscription` times its GPUs (default 2x).

Priorities (section 4.2.2): a higher-priority job is never time-sliced with a
lower-priority one: a job never over-subscribes a server that holds a
higher-priority job, and over-subscribing lower-priority jobs suspends them
until the server is not over-subscribed (they move elsewhere if they can).
Only jobs of equal priority are packed together. Round-robin is
unweighted (the paper's weights are not stated).

Grow-shrink (sections 4.1 and 4.2.2): only opt-in jobs, named by `grow_shrink_jobs`
(a set of `JobView.application` names, or a predicate; none by default, as in
the paper's cluster runs). A job grows only when the cluster is
under-utilized (no job waits, none is time-sliced or packed), only on its own
server, only onto GPUs that have been free for `grow_idle_period` seconds,
and up to `JobView.max_gpus`; jobs on a server grow in priority order. A
grown job shrinks immediately, as far as needed, when a job needs its GPUs
(placement or migration), and before any other repair of its server. The
paper's "split by profiled progress rate" is not stated precisely; gpuq
gives a server's idle GPUs to its oldest growable job first.

The seed is accepted for the common interface; every tie is broken by node
order and job id, so decisions are deterministic. The policy remembers
affinities, packs, failed pairs, measurements and idle timers between
decisions (saved and restored across daemon restarts: `Remembers`); a call
with an earlier `now` than the last starts afresh. Live, the daemon takes
the turns on over-subscribed servers (`gpuq.daemon.scheduler.slicer`) in
quanta of `quantum` seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gpuq.policies.gandiva.book import Book, overloaded, queue_key
from gpuq.policies.gandiva.migration import defragment, dissolve_packs, lower_height
from gpuq.policies.gandiva.packing import Pack, Tracker, review_packs, try_packs
from gpuq.policies.gandiva.placement import enforce_limits, place_pending
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView

UNKNOWN_PACK_RATE = 0.5
"""A packed job's rate, as a fraction of solo, before it is measured (time-slicing's)."""


class GandivaPolicy:
    """Gandiva: Algorithm 1 placement, time-slicing, packing, migration, grow-shrink."""

    name = "gandiva"
    capabilities = Capabilities(time_slicing=True, packing=True, preemption=True, remembers=True)

    def __init__(
        self,
        quantum: float = 60.0,
        packing: bool = True,
        migration: bool = True,
        grow_shrink: bool = True,
        seed: int = 0,
        *,
        oversubscription: float = 2.0,
        defrag_threshold: float = 0.75,
        keep_threshold: float = 1.0,
        max_pack_utilization: float = 100.0,
        grow_idle_period: float = 120.0,
        grow_shrink_jobs: frozenset[str] | Callable[[JobView], bool] = frozenset(),
    ) -> None:
        if quantum <= 0:
            raise ValueError(f"quantum must be positive, got {quantum}")
        if oversubscription < 1:
            raise ValueError(f"oversubscription must be at least 1, got {oversubscription}")
        if not 0 < defrag_threshold <= 1:
            raise ValueError(f"defrag_threshold must be in (0, 1], got {defrag_threshold}")
        self.quantum = quantum
        self.capabilities = replace(GandivaPolicy.capabilities, quantum=quantum)
        self.packing = packing
        self.migration = migration
        self.grow_shrink = grow_shrink
        self.seed = seed
        self.oversubscription = oversubscription
        self.defrag_threshold = defrag_threshold
        self.keep_threshold = keep_threshold
        self.max_pack_utilization = max_pack_utilization
        self.grow_idle_period = grow_idle_period
        if callable(grow_shrink_jobs):
            self._opts_in: Callable[[JobView], bool] = grow_shrink_jobs
        else:
            names = frozenset(grow_shrink_jobs)
            self._opts_in = lambda job: job.application in names
        self._reset()

    def _reset(self) -> None:
        self._last_now: float | None = None
        self._affinity: dict[str, int] = {}
        self._packs: dict[int, Pack] = {}
        self._failed: set[frozenset[int]] = set()
        self._idle_since: dict[str, float] = {}
        self._tracker = Tracker()

    @property
    def affinity(self) -> dict[str, int]:
        """Each busy server's affinity after the last decision (empty servers omitted)."""
        return dict(self._affinity)

    def save(self) -> dict[str, Any]:
        """Its memory (`Remembers`): affinities, packs, failed pairs, idle timers, measurements."""
        return {
            "version": 1,
            "last_now": self._last_now,
            "affinity": dict(self._affinity),
            "packs": {
                str(guest): {
                    "host": p.host,
                    "since": p.since,
                    "rates": {str(j): r for j, r in p.rates.items()},
                }
                for guest, p in self._packs.items()
            },
            "failed": sorted(sorted(pair) for pair in self._failed),
            "idle_since": dict(self._idle_since),
            "tracker": self._tracker.save(),
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned; ValueError if it is not that."""
        version = saved.get("version")
        if version != 1:
            raise ValueError(f"not a saved {self.name} policy: unknown version {version!r}")
        fresh = GandivaPolicy.__new__(GandivaPolicy)
        fresh._reset()
        try:
            last = saved["last_now"]
            fresh._last_now = None if last is None else float(last)
            fresh._affinity = {str(n): int(a) for n, a in saved["affinity"].items()}
            fresh._packs = {
                int(guest): Pack(
                    int(pack["host"]),
                    float(pack["since"]),
                    {int(j): float(r) for j, r in pack["rates"].items()},
                )
                for guest, pack in saved["packs"].items()
            }
            fresh._failed = {frozenset(int(j) for j in pair) for pair in saved["failed"]}
            fresh._idle_since = {str(n): float(t) for n, t in saved["idle_since"].items()}
            fresh._tracker.restore(saved["tracker"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a saved {self.name} policy: {exc}") from None
        self._last_now, self._affinity, self._packs = (
            fresh._last_now,
            fresh._affinity,
            fresh._packs,
        )
        self._failed, self._idle_since, self._tracker = (
            fresh._failed,
            fresh._idle_since,
            fresh._tracker,
        )

    def opts_in(self, job: JobView) -> bool:
        """True if the job may grow and shrink."""
        return self.grow_shrink and self._opts_in(job)

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Place, time-slice, migrate, pack and grow; see the module docstring."""
        if self._last_now is not None and now < self._last_now:
            self._reset()
        self._last_now = now
        tracker = self._tracker
        tracker.observe(state, now)
        for job in state.jobs:
            self._failed.update(frozenset((job.id, other)) for other in job.oom_partners)
        packs = {guest: pack.host for guest, pack in self._packs.items()}
        book = Book.from_state(state, self.oversubscription, self._affinity, packs, self.opts_in)
        self._packs = {g: p for g, p in self._packs.items() if book.host_of.get(g) == p.host}
        if self.packing:
            review_packs(book, tracker, self._packs, self._failed, self.keep_threshold)
        enforce_limits(book)
        place_pending(book)

        def remaining(job_id: int) -> float | None:
            return tracker.remaining_work(book.jobs[job_id], book)

        def pack_rate(job_id: int) -> float:
            pack = self._packs.get(job_id)
            return pack.rates.get(job_id, UNKNOWN_PACK_RATE) if pack else UNKNOWN_PACK_RATE

        penalty = state.restart_penalty
        if self.migration:
            lower_height(book, penalty, remaining)
            dissolve_packs(book, penalty, remaining, pack_rate)
            defragment(book, self.defrag_threshold, penalty, remaining)
        else:
            dissolve_packs(book, penalty, lambda _: 0.0, pack_rate, migrate=False)
        if self.packing and state.gpu_memory is not None and overloaded(state):
            try_packs(
                book,
                tracker,
                self._packs,
                self._failed,
                state.gpu_memory,
                self.max_pack_utilization,
                self.migration,
                now,
            )
        if self.grow_shrink:
            self._grow(book, now)
        self._finish_notes(book)
        self._affinity = {n.name: a for n, a in zip(book.nodes, book.affinity, strict=True) if a}
        self._packs = {g: p for g, p in self._packs.items() if book.host_of.get(g) == p.host}
        tracker.record(book, state, now)
        return Decision(
            allocations={job_id: tuple(book.alloc[job_id]) for job_id in sorted(book.alloc)},
            packed=tuple(sorted((host, guest) for guest, host in book.host_of.items())),
            notes={job_id: book.notes[job_id] for job_id in sorted(book.notes)},
        )

    def _grow(self, book: Book, now: float) -> None:
        """Give idle GPUs to opt-in jobs on their own server once the cluster is idle enough."""
        for i, node in enumerate(book.nodes):
            if book.available(i) > 0:
                self._idle_since.setdefault(node.name, now)
            else:
                self._idle_since.pop(node.name, None)
        total = sum(node.gpus for node in book.nodes)
        waiting = any(1 <= job.gpus_requested <= total for job in book.pending())
        if waiting or book.host_of or any(book.over(i) for i in range(len(book.nodes))):
            return
        for i, node in enumerate(book.nodes):
            if not book.free(i) or now - self._idle_since[node.name] < self.grow_idle_period:
                continue
            growable = [
                book.jobs[j]
                for j in book.residents[i]
                if self.opts_in(book.jobs[j]) and book.nodes_of(j) == [i]
            ]
            for job in sorted(growable, key=queue_key):
                extra = min(book.free(i), job.max_gpus - book.gpus(job.id))
                if extra <= 0 or job.gpus_requested < 1:
                    continue
                book.base.setdefault(job.id, job.gpus_requested)
                book.resize(job.id, i, book.alloc[job.id][i] + extra)
                book.notes[job.id] = f"grown to {book.gpus(job.id)} GPUs on {node.name}: idle GPUs"

    @staticmethod
    def _finish_notes(book: Book) -> None:
        """Give every job a note: where it runs and whether it is time-sliced, or why it waits."""
        for job_id in book.jobs:
            note = book.notes.get(job_id, "")
            if job_id not in book.alloc:
                if not note.startswith("queued"):
                    book.notes[job_id] = f"queued: {note}" if note else "queued"
                continue
            if note.startswith("queued"):
                note = ""
            partner = book.partner(job_id)
            if not note and partner is not None:
                note = f"packed with job {partner} on {book.placement_text(job_id)}"
            over = [i for i in book.nodes_of(job_id) if book.over(i)]
            if over and "time-sliced" not in note:
                sliced = f"time-sliced on {book.node_text(over[0])}"
                note = f"{note}; {sliced}" if note else sliced
            book.notes[job_id] = note or f"running on {book.placement_text(job_id)}"
