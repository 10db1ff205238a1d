"""Gandiva's introspection: measured progress rates and greedy, measured packing.

The measurements and judgements are shared with the `gpuq` policy
(`gpuq.policies.packing`); this module applies them to Gandiva's `Book`.

Measurement. Gandiva judges every change by the jobs' mini_batch_time before
and after it. Where the caller measures step times (the daemon, from the
runner: `JobView.step_seconds`), a job's rate is 1 / step_seconds: its solo
rate when it computed alone (`step_shared_with` empty; time waiting for a
turn is not in a step), and its packed rate, a fraction of solo, when it
computed beside its packed partner (`gpuq.policies.packing.Rates`).
Elsewhere (the simulator) the policy sees no clock and no step times, so
`Tracker` measures progress between two decisions from
`JobView.remaining_iterations`: over the interval from the previous
decision (at t0) to this one (at t1),

    rate = (remaining(t0) - remaining(t1)) / (t1 - t0)   iterations per second.

An interval counts only if the job ran all of it in one configuration: it held
the allocation this policy gave it at t0 (the caller applied it), that
allocation was not a change (so no restart penalty fell in it), and both
remaining counts are known. The configuration also records the job's packed
partner and its time-slicing share s (GPUs over demand on its most loaded
node, a packed pair's GPU counted once, as the caller shares it). Then:

- unpacked: the job's *solo rate* is rate / s (its exclusive speed);
- packed: its *packed rate* is rate / (s * solo rate), a fraction of solo.

Remaining work (for migration decisions) is remaining_iterations over the solo
rate, or over the goodput model's throughput where the job runs divided by its
batch size before any measurement; unknown (None) without either.

Packing (only during overload; paper sections 4.1 and 4.2.2). Candidates are
1-GPU jobs that do not ask for their GPUs alone (`exclusive`), whose solo
rate has been measured (Gandiva profiles jobs alone
first), with a known `gpu_utilization` and `memory_peak`; a job whose
utilization or memory is unknown is treated as high-utilization and never
packed, and nothing is packed when `ClusterState.gpu_memory` is unknown.
Guests are candidates that are time-sliced (their node is over-subscribed) or
waiting, lowest utilization first; each is packed onto the host of lowest
utilization (ties: the guest's own node, then node order, then id), if
both memory peaks fit in one GPU, their utilizations add up to at most
`max_utilization` (gpuq's gate against hopeless trials; the paper tries any
pair), both have the same priority (so packing never mixes priorities), the
pair has not failed before (slower than time-slicing, or one ran out of
GPU memory beside the other: `JobView.oom_partners`), and the host is on the guest's node or, when
migration is allowed, on a node that is not over-subscribed (a guest never
moves into time-slicing). A waiting guest may join any such host. Only pairs
are packed.

Keep or undo. Time-slicing one GPU between the two jobs gives each half its
solo rate, 1.0 of solo in all; packing must beat that. A pack is kept while the sum
of its members' latest packed rates exceeds `keep_threshold` (default 1.0)
and undone (the guest stays on its node, time-sliced) the first time it does
not, with the reason "packed throughput 0.71 of time-sliced (0.36+0.35 of
solo)"; a failed pair is never tried again, and the guest tries the next GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuq.policies.gandiva.book import Book
from gpuq.policies.interface import ClusterState, JobView
from gpuq.policies.packing import Pack, Profile, Rates, judge, pair_fits, profile, trial_note


@dataclass(frozen=True, slots=True)
class _Seen:
    time: float
    remaining: float | None
    allocation: tuple[int, ...]
    partner: int | None
    share: float
    restarted: bool


class Tracker(Rates):
    """Progress rates: measured step times, else measured between decisions (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[int, _Seen] = {}

    def save(self) -> dict[str, Any]:
        """What it measured, JSON-ready (the policy's `save`)."""
        return {
            "seen": {
                str(job_id): [
                    seen.time,
                    seen.remaining,
                    list(seen.allocation),
                    seen.partner,
                    seen.share,
                    seen.restarted,
                ]
                for job_id, seen in self._seen.items()
            },
            **super().save(),
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned (KeyError, TypeError or ValueError if it cannot)."""
        self._seen = {
            int(job_id): _Seen(
                float(time),
                None if remaining is None else float(remaining),
                tuple(int(n) for n in allocation),
                None if partner is None else int(partner),
                float(share),
                bool(restarted),
            )
            for job_id, (time, remaining, allocation, partner, share, restarted) in saved[
                "seen"
            ].items()
        }
        super().restore(saved)

    def unmeasured(self, job: JobView, now: float) -> None:
        """Measure the job's rate over the interval that ends now, from its remaining work."""
        seen = self._seen.get(job.id)
        if (
            seen is None
            or seen.restarted
            or seen.remaining is None
            or job.remaining_iterations is None
            or job.allocation != seen.allocation
            or now <= seen.time
            or seen.share <= 0.0
        ):
            return
        rate = (seen.remaining - job.remaining_iterations) / (now - seen.time)
        if rate < 0.0:
            return
        if seen.partner is None:
            self.solo[job.id] = rate / seen.share
        elif self.solo.get(job.id, 0.0) > 0.0:
            self.packed[job.id] = (seen.partner, rate / (seen.share * self.solo[job.id]))

    def record(self, book: Book, state: ClusterState, now: float) -> None:
        """Remember each job's configuration as decided now, for the next interval."""
        self._seen = {}
        for job in state.jobs:
            allocation = tuple(book.alloc.get(job.id, ()))
            self._seen[job.id] = _Seen(
                now,
                job.remaining_iterations,
                allocation,
                book.partner(job.id),
                book.share(job.id) if allocation else 0.0,
                allocation != job.allocation,
            )

    def remaining_work(self, job: JobView, book: Book) -> float | None:
        """Seconds of exclusive work the job has left where it runs (None if unknown)."""
        remaining = job.remaining_iterations
        if remaining is None:
            return None
        rate = self.solo.get(job.id, 0.0)
        model, gpus = job.goodput, book.gpus(job.id)
        if rate <= 0.0 and model is not None and gpus and job.batch_size >= 1:
            local_bsz = max(1, -(-job.batch_size // gpus))
            spanned = len(book.nodes_of(job.id))
            rate = model.throughput(spanned, gpus, local_bsz, 0) / job.batch_size
        return remaining / rate if rate > 0.0 else None


def review_packs(
    book: Book,
    tracker: Tracker,
    packs: dict[int, Pack],
    failed: set[frozenset[int]],
    keep_threshold: float,
) -> None:
    """Update each pack's measured rates; undo those no better than time-slicing."""
    for guest, pack in sorted(packs.items()):
        if book.host_of.get(guest) != pack.host:
            continue
        where = book.nodes[book.node_of(guest)].name
        verdict = judge(pack, guest, tracker.packed, keep_threshold, where)
        if verdict.undo:
            book.unpack(guest)
            failed.add(frozenset((guest, pack.host)))
        book.notes[guest] = book.notes[pack.host] = verdict.note


def try_packs(
    book: Book,
    tracker: Tracker,
    packs: dict[int, Pack],
    failed: set[frozenset[int]],
    gpu_memory: int,
    max_utilization: float,
    migration: bool,
    now: float,
) -> None:
    """Greedy packing: lowest-utilization guest onto the lowest-utilization GPU."""

    def candidate(job_id: int) -> Profile | None:
        job = book.jobs[job_id]
        if job_id in book.base or book.packed(job_id) or book.gpus(job_id) > 1:
            return None
        return profile(job, tracker.solo.get(job_id))

    def waits(job_id: int) -> bool:
        return job_id not in book.alloc or book.over(book.node_of(job_id))

    profiles = {j: p for j in sorted(book.jobs) if (p := candidate(j)) is not None}
    guests = sorted((j for j in profiles if waits(j)), key=lambda j: (profiles[j].utilization, j))
    for guest in guests:
        if book.packed(guest) or not waits(guest):
            continue
        home = book.node_of(guest) if guest in book.alloc else None
        mobile = migration or home is None
        options = [
            host
            for host in profiles
            if host in book.alloc
            and book.can_pair(guest, host)
            and frozenset((guest, host)) not in failed
            and pair_fits(profiles[guest], profiles[host], gpu_memory, max_utilization)
            and book.jobs[host].priority == book.jobs[guest].priority
            and book.node_of(host) not in book.barred(guest)
            and (book.node_of(host) == home or (mobile and not book.over(book.node_of(host))))
        ]
        if not options:
            continue
        host = min(
            options,
            key=lambda h: (profiles[h].utilization, book.node_of(h) != home, book.node_of(h), h),
        )
        book.pack(guest, host)
        packs[guest] = Pack(host, now)
        where = book.nodes[book.node_of(host)].name
        book.notes[guest] = book.notes[host] = trial_note(where, profiles[guest], profiles[host])
