"""AFS share computation on plain throughput tables (Hwang et al., NSDI'21, §3).

This module is the paper's algorithm and nothing else: it sees jobs as a key,
a throughput table `thr[0..K]` (iterations per second on `r` GPUs, with
`thr[0] = 0`) and, for AFS-L, the remaining iterations. The policy in
`gpuq.policies.afs.policy` builds those tables from a cluster state; packing and
placement are in `gpuq.policies.afs.packing`.

Comparator (3)
    With `p` a job's throughput at its current count and `p'` at one GPU
    more, the longer job `b` gets the next GPU rather than the shorter job
    `a` iff `(p'_b - p_b) / p'_b > (p'_a - p_a) / p_a`, strict, exactly as
    printed (`prefers_longer`). A shorter job with no throughput yet
    (`p_a = 0`) has an infinite right-hand side, so it always wins.

AFS-L (Algorithm 1, `afs_l`)
    M rounds of TOPPRIORITY, each giving one GPU. Stage one is explicit, as
    in the prose: while jobs hold no GPU, the next GPU goes to the zero-GPU
    job that is shortest on one GPU, so with more jobs than GPUs this is
    SRTF with one GPU each. Stage two scans the jobs in input order as the
    pseudo-code does (`j*` starts at the first job; the job that is shorter
    at its current count plays `a`, ties of length make the scanned job `a`;
    `len(0)` is infinite). For strictly sublinear tables the literal
    pseudo-code gives the same shares (tested); the explicit stage one only
    differs for a job scaling linearly or better from 1 to 2 GPUs, where the
    strict ">" would let it take a second GPU before others get a first.

AFS-P (`afs_p`, `processor_sharing`)
    When jobs do not outnumber the GPUs, every job gets one GPU (stage one),
    then each further GPU goes to the winner of the modified TOPPRIORITY,
    which evaluates (3) in both role orders; when (3) is false both ways the
    winner is a seeded coin. The coin is fixed per seed and pair of jobs
    (`tie_winner`), so re-running the allocator at the next event does not
    reshuffle tied jobs (each reshuffle is a restart in gpuq). When jobs
    outnumber the GPUs, `processor_sharing` picks who runs with one GPU:
    jobs still inside their time unit keep their GPU (non-preemptive), and
    the free GPUs go to the lowest counters, ties in the caller's order.

Peak cap (the paper hands out all M GPUs even when one more GPU does not
help; Appendix B only analyses the regime where it does): with
`cap_at_peak` (the default) a job never gets more GPUs than the smallest
count reaching its peak throughput, and GPUs nobody can use stay idle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_MASK64 = (1 << 64) - 1


def prefers_longer(
    shorter_now: float, shorter_next: float, longer_now: float, longer_next: float
) -> bool:
    """Inequality (3): True when the longer job should get the next GPU.

    `*_now` is a job's throughput at its current GPU count, `*_next` at one
    GPU more: the longer job's gain over its new throughput must strictly
    exceed the shorter job's gain over its current throughput.
    """
    if longer_next <= 0.0 or shorter_now <= 0.0:
        return False
    lhs = (longer_next - longer_now) / longer_next
    rhs = (shorter_next - shorter_now) / shorter_now
    return lhs > rhs


def peak_gpus(throughput: Sequence[float]) -> int:
    """The smallest GPU count at which `throughput` reaches its maximum (at least 1)."""
    best = max(throughput[1:])
    return next(r for r in range(1, len(throughput)) if throughput[r] == best)


@dataclass(frozen=True, slots=True)
class AfsJob:
    """A job as AFS sees it: a key, its throughput table and its remaining iterations.

    `throughput[r]` is iterations per second on `r` GPUs, `throughput[0] = 0`
    and every other entry positive; the table's length bounds the job's GPUs.
    `remaining` is infinite when unknown (AFS-P never reads it).
    """

    key: int
    throughput: tuple[float, ...]
    remaining: float = math.inf

    def __post_init__(self) -> None:
        thr = self.throughput
        if len(thr) < 2 or thr[0] != 0.0:
            raise ValueError(f"job {self.key}: need thr[0] == 0 and thr[1], got {thr}")
        if not all(math.isfinite(value) and value > 0.0 for value in thr[1:]):
            raise ValueError(f"job {self.key}: throughput on r >= 1 GPUs must be > 0: {thr}")
        if math.isnan(self.remaining) or self.remaining < 0.0:
            raise ValueError(f"job {self.key}: remaining must be >= 0, got {self.remaining}")

    @property
    def max_gpus(self) -> int:
        """The most GPUs the table covers."""
        return len(self.throughput) - 1

    def length(self, gpus: int) -> float:
        """Seconds to finish on `gpus` GPUs; infinite on none (the paper's len(0))."""
        return math.inf if gpus == 0 else self.remaining / self.throughput[gpus]


@dataclass(frozen=True, slots=True)
class Shares:
    """GPU counts per job key, and the keys in the order the GPUs were handed out."""

    counts: Mapping[int, int]
    order: tuple[int, ...]


def tie_winner(seed: int, first: int, second: int) -> int:
    """A seeded coin between two jobs: the key that wins, the same for either argument order."""
    low, high = min(first, second), max(first, second)
    x = (seed * 0x9E3779B97F4A7C15 + low * 0xBF58476D1CE4E5B9 + high) & _MASK64
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * factor) & _MASK64
    x ^= x >> 31
    return low if x & 1 else high


class _Counts:
    """Per-job GPU counts while GPUs are handed out, with each job's limit."""

    def __init__(self, jobs: Sequence[AfsJob], cap_at_peak: bool) -> None:
        keys = [job.key for job in jobs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"job keys must be unique: {keys}")
        self.jobs = list(jobs)
        self.count = dict.fromkeys(keys, 0)
        self.limit = {
            job.key: peak_gpus(job.throughput) if cap_at_peak else job.max_gpus for job in jobs
        }
        self.order: list[int] = []

    def give(self, job: AfsJob) -> None:
        self.count[job.key] += 1
        self.order.append(job.key)

    def open(self) -> list[AfsJob]:
        """Jobs that may still take a GPU, in input order."""
        return [job for job in self.jobs if self.count[job.key] < self.limit[job.key]]

    def now_next(self, job: AfsJob) -> tuple[float, float]:
        count = self.count[job.key]
        return job.throughput[count], job.throughput[count + 1]

    def shares(self) -> Shares:
        return Shares(dict(self.count), tuple(self.order))


def _top_priority_l(candidates: Sequence[AfsJob], counts: _Counts) -> AfsJob:
    """Algorithm 1's TOPPRIORITY over `candidates`, scanned in order."""
    star = candidates[0]
    for job in candidates:
        a, b = star, job
        count_a, count_b = counts.count[a.key], counts.count[b.key]
        if count_a == 0 and count_b == 0:
            star = a if a.length(1) < b.length(1) else b
            continue
        if a.length(count_a) >= b.length(count_b):
            a, b = b, a
        star = b if prefers_longer(*counts.now_next(a), *counts.now_next(b)) else a
    return star


def afs_l(
    jobs: Sequence[AfsJob], gpus: int, *, explicit_stage_one: bool = True, cap_at_peak: bool = True
) -> Shares:
    """AFS-L (Algorithm 1): hand out `gpus` GPUs one at a time to TOPPRIORITY's job."""
    counts = _Counts(jobs, cap_at_peak)
    if explicit_stage_one:
        position = {job.key: i for i, job in enumerate(jobs)}
        by_length = sorted(jobs, key=lambda job: (job.length(1), position[job.key]))
        for job in by_length[: max(gpus, 0)]:
            counts.give(job)
    while len(counts.order) < gpus:
        candidates = counts.open()
        if not candidates:
            break
        counts.give(_top_priority_l(candidates, counts))
    return counts.shares()


def _top_priority_p(candidates: Sequence[AfsJob], counts: _Counts, seed: int) -> AfsJob:
    """The length-unaware TOPPRIORITY: (3) in both role orders, a seeded coin if neither."""
    star = candidates[0]
    for job in candidates[1:]:
        star_now, star_next = counts.now_next(star)
        job_now, job_next = counts.now_next(job)
        if prefers_longer(star_now, star_next, job_now, job_next):
            star = job
        elif not prefers_longer(job_now, job_next, star_now, star_next):
            star = job if tie_winner(seed, star.key, job.key) == job.key else star
    return star


def afs_p(jobs: Sequence[AfsJob], gpus: int, *, seed: int = 0, cap_at_peak: bool = True) -> Shares:
    """AFS-P when jobs do not outnumber GPUs: one GPU each, then the modified TOPPRIORITY."""
    if len(jobs) > gpus:
        raise ValueError(f"{len(jobs)} jobs on {gpus} GPUs: use processor_sharing")
    counts = _Counts(jobs, cap_at_peak)
    for job in jobs:
        counts.give(job)
    while len(counts.order) < gpus:
        candidates = counts.open()
        if not candidates:
            break
        counts.give(_top_priority_p(candidates, counts, seed))
    return counts.shares()


def processor_sharing(
    queue: Sequence[tuple[int, int]], holding: frozenset[int] | set[int], gpus: int
) -> tuple[int, ...]:
    """AFS-P's stage one when jobs outnumber GPUs: the keys that run, one GPU each.

    `queue` lists (key, counter of executed time units) in tie-break order;
    `holding` are the keys still inside their unit, which keep their GPU
    (non-preemptive; if they alone exceed `gpus`, the lowest counters stay).
    The remaining GPUs go to the other jobs with the lowest counters.
    """
    position = {key: i for i, (key, _) in enumerate(queue)}
    ranked = sorted(queue, key=lambda item: (item[1], position[item[0]]))
    keepers = [key for key, _ in ranked if key in holding][: max(gpus, 0)]
    free = max(gpus, 0) - len(keepers)
    newcomers = [key for key, _ in ranked if key not in holding][:free]
    chosen = set(keepers) | set(newcomers)
    return tuple(key for key, _ in ranked if key in chosen)
