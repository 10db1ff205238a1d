"""ONES's evolution operators: refresh, uniform crossover, uniform mutation (section 3.2.2).

The operators work on a candidate's `counts` (GPUs per job row and node;
crossover takes the GPU-indexed genomes, as in the paper). Each returns
candidates that fit every node and keep every job within its allowed GPU
counts and batch limit (`JobRules`), and leaves pinned jobs (deployment
gating) on their live GPUs (`pin`); reorder lives in `genome`.
Choices gpuq makes:

Refresh
    (1) frees the GPUs of jobs that are gone; (2) shrinks each job whose batch
    is over its limit by whole GPUs, keeping its per-GPU batch, as the paper
    does (then repairs any remaining excess); (3) places each new job (one
    that has never run) on its fewest allowed GPUs, oldest first, taking GPUs
    one at a time from the job with the most GPUs, but never below that job's
    own minimum: a new job does not preempt anyone here (mutation does that);
    (4) fills idle GPUs (`fill`).
Fill ("utilization gain", Fig. 7)
    Repeatedly gives one more GPU to a running job, or its first GPUs to a
    waiting one, until no GPU is idle or no job gains. The paper's gain
    formula is lost; gpuq's gain is the rise in the job's completion rate
    X_j / W_j per GPU added (so short jobs and well-scaling jobs go first),
    with W_j freshly sampled at each pick (Alg. 1) and X_j on the node count
    the added GPU gives. A job grows on its own nodes first (where it has
    most workers); a waiting job starts on the fullest node that fits it
    (best fit, keeping whole nodes free for wide jobs), else on the emptiest.
Uniform crossover (Fig. 8)
    Each GPU's gene goes from parent A to child 1 and from B to child 2, or
    the other way round, with probability 1/2; children are then repaired by
    `normalize` (a job may have inherited too many GPUs) and filled.
Uniform mutation (Fig. 9)
    Each job in the candidate is preempted with probability `rate`; the freed
    GPUs are filled from the other jobs first, then, so that no candidate
    scores better merely by idling GPUs, by anyone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from gpuq.policies.ones.fitness import FloatArray, Progress
from gpuq.policies.ones.genome import (
    Candidate,
    Genome,
    IntArray,
    JobRules,
    Layout,
    candidate_counts,
    counts_of_rows,
    drop_from,
    normalize,
    place_on_nodes,
    reorder,
    to_counts,
)

BoolArray = NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class Context:
    """What the operators need to know about the jobs at this decision.

    `limit` is each job's effective batch limit, `new` marks jobs that have
    never run, `arrival` lists rows oldest first and `capacity` is the GPUs
    of each node. `pinned` rows are running jobs that may not change yet
    (deployment gating): every candidate keeps their `live` GPUs per node. Operators work on
    `counts`, the GPUs per (row, node) of a candidate (GPUs within a node are
    interchangeable); `ones_genome.from_counts` turns them back into genomes.
    """

    rules: JobRules
    layout: Layout
    table: FloatArray
    progress: Progress
    limit: IntArray
    new: BoolArray
    arrival: IntArray
    rng: np.random.Generator
    capacity: IntArray
    pinned: BoolArray
    live: IntArray
    any_pinned: bool = field(init=False)
    """Whether some job is pinned (derived, like the fields below)."""
    free_rows: BoolArray = field(init=False)
    """Rows that may change and may run at all: not pinned, with some allowed GPU count."""
    new_rows: tuple[int, ...] = field(init=False)
    """Rows of new jobs that may run, oldest first (`place_new_jobs`)."""
    memo: dict[bytes, IntArray] = field(init=False)
    """Results that follow from their input and this context alone, by a tagged key:
    `refresh` and `crossover` results that involved no random draw, and genes."""

    def __post_init__(self) -> None:
        # Derived once per decision: the operators run hundreds of times on it.
        object.__setattr__(self, "any_pinned", bool(self.pinned.any()))
        object.__setattr__(self, "free_rows", ~self.pinned & (self.rules.n_max > 0))
        runnable = self.new & (self.rules.n_max > 0)
        object.__setattr__(
            self, "new_rows", tuple(row for row in self.arrival.tolist() if runnable[row])
        )
        object.__setattr__(self, "memo", {})

    @property
    def everyone(self) -> BoolArray:
        """A mask selecting every job."""
        return np.ones(len(self.rules.ids), dtype=np.bool_)


def fill(counts: IntArray, ctx: Context, eligible: BoolArray, scale_up: bool = True) -> bool:
    """Give idle GPUs to the jobs with the largest sampled utilization gain, in place.

    Only `eligible` jobs gain GPUs; without `scale_up` only waiting jobs do.
    Returns whether it drew from `ctx.rng` (otherwise the result follows from
    `counts` and `ctx` alone).
    """
    idle = ctx.capacity - counts.sum(axis=0)
    free = int(idle.sum())
    if free <= 0:
        return False
    drew = False
    rules, layout, table = ctx.rules, ctx.layout, ctx.table
    gpus = counts.sum(axis=1)
    spans = (counts != 0).sum(axis=1)
    held = counts > 0
    rows = np.arange(len(rules.ids))
    allowed = eligible & ctx.free_rows
    # Per-job terms that change only for the job that grows (updated below).
    waiting = gpus == 0
    grow = np.where(waiting, rules.n_min, 1)
    wider = np.minimum(gpus + grow, layout.gpus)
    fits = allowed & (gpus + grow <= rules.n_max)
    if not scale_up:
        fits &= waiting
    steps = np.maximum(grow, 1)
    speed = table[rows, gpus, spans]
    while free > 0:
        ok = fits & (grow <= free)
        if not ok.any():
            return drew
        room_at_home = (held & (idle > 0)).any(axis=1)
        covered = np.cumsum(np.sort(idle)[::-1])
        start_spans = np.searchsorted(covered, rules.n_min) + 1
        new_spans = np.where(waiting, start_spans, np.where(room_at_home, spans, spans + 1))
        new_spans = np.clip(new_spans, 1, layout.nodes)
        faster = table[rows, wider, new_spans] - speed
        work = ctx.progress.sample(ctx.rng)
        drew = True
        gain = np.where(ok, faster / (steps * np.maximum(work, 1e-12)), -np.inf)
        best = int(np.argmax(gain))
        if not gain[best] > 0:
            return drew
        if gpus[best] > 0 and room_at_home[best]:
            home = np.flatnonzero(held[best] & (idle > 0))
            take = np.zeros_like(idle)
            take[home[np.argmax(counts[best, home])]] = 1
        else:
            take = place_on_nodes(idle, int(grow[best]), counts[best])
        counts[best] += take
        idle -= take
        gpus[best] += int(grow[best])
        held[best] = counts[best] > 0
        spans[best] = np.count_nonzero(counts[best])
        waiting[best] = False
        grow[best] = steps[best] = 1
        wider[best] = min(gpus[best] + 1, layout.gpus)
        fits[best] = allowed[best] and gpus[best] + 1 <= rules.n_max[best] and scale_up
        speed[best] = table[best, gpus[best], spans[best]]
        free = int(idle.sum())
    return drew


def place_new_jobs(counts: IntArray, ctx: Context) -> None:
    """Step (3) of refresh: new jobs first, taking GPUs from the largest jobs."""
    if not ctx.new_rows:
        return
    rules = ctx.rules
    gpus = counts.sum(axis=1)
    free = int(ctx.capacity.sum() - gpus.sum())
    for row in ctx.new_rows:
        if gpus[row] > 0:
            continue
        need = int(rules.n_min[row])
        while free < need:
            spare = np.where((gpus > rules.n_min) & ~ctx.pinned, gpus, 0)
            donor = int(np.argmax(spare))
            if spare[donor] == 0:
                break
            drop_from(counts[donor], 1)
            gpus[donor] -= 1
            free += 1
        if free < need:
            if free == 0:
                return
            continue
        idle = ctx.capacity - counts.sum(axis=0)
        counts[row] = place_on_nodes(idle, need, np.zeros_like(idle))
        gpus[row] = need
        free -= need


def pin(counts: IntArray, ctx: Context) -> None:
    """Put pinned jobs back on their live GPUs, evicting others' workers where needed."""
    if not ctx.any_pinned:
        return
    counts[ctx.pinned] = ctx.live[ctx.pinned]
    over = counts.sum(axis=0) - ctx.capacity
    for node in np.flatnonzero(over > 0).tolist():
        excess = int(over[node])
        movable = np.flatnonzero(~ctx.pinned & (counts[:, node] > 0))
        for row in movable[np.argsort(counts[movable, node], kind="stable")].tolist():
            gone = min(excess, int(counts[row, node]))
            counts[row, node] -= gone
            excess -= gone
            if excess == 0:
                break


def _repair(counts: IntArray, ctx: Context) -> None:
    """Pin, then enforce the rules on the other jobs."""
    pin(counts, ctx)
    normalize(counts, ctx.rules, ctx.pinned)


def refresh(genome: Genome | Candidate, ctx: Context) -> IntArray:
    """Bring a candidate up to date with the jobs: steps (1)-(4), then reorder.

    Returns the refreshed candidate's GPUs per (row, node).
    """
    kept = None
    if isinstance(genome, Candidate):  # kept candidates often repeat: memo by content
        kept = b"k" + genome.ids.tobytes() + genome.counts.tobytes() + genome.batch.tobytes()
        known = ctx.memo.get(kept)
        if known is not None:
            return known.copy()
        counts, batch = candidate_counts(genome, ctx.rules, ctx.layout)
    else:
        counts, batch = to_counts(genome, ctx.rules, ctx.layout)
    key = b"r" + counts.tobytes() + batch.tobytes()
    known = ctx.memo.get(key)
    if known is None:
        gpus = counts.sum(axis=1)
        for row in np.flatnonzero((gpus > 0) & (batch > ctx.limit) & ~ctx.pinned).tolist():
            keep = int(gpus[row] * ctx.limit[row] // batch[row])
            drop_from(counts[row], int(gpus[row]) - keep)
        _repair(counts, ctx)
        place_new_jobs(counts, ctx)
        drew = fill(counts, ctx, ctx.everyone)
        reorder(counts, ctx.layout, ctx.pinned)
        if drew:
            return counts
        known = ctx.memo[key] = counts
    if kept is not None:
        ctx.memo[kept] = known
    return known.copy()


def crossover(a: IntArray, b: IntArray, ctx: Context) -> tuple[IntArray, IntArray]:
    """Two children of `a` and `b` by uniform crossover, repaired and filled.

    `a` and `b` are the parents' genes as job rows (`ones_genome.gene_rows`):
    a child's batches follow from its GPU counts, so the genes' batches are
    not needed.
    """
    first = ctx.rng.random(len(a)) < 0.5
    jobs = len(ctx.rules.ids)
    result = []
    for genes in (np.where(first, a, b), np.where(first, b, a)):
        by_genes = b"g" + genes.tobytes()
        known = ctx.memo.get(by_genes)
        if known is not None:
            result.append(known.copy())
            continue
        counts = counts_of_rows(genes, jobs, ctx.layout)
        key = b"c" + counts.tobytes()
        known = ctx.memo.get(key)
        if known is None:
            _repair(counts, ctx)
            drew = fill(counts, ctx, ctx.everyone)
            reorder(counts, ctx.layout, ctx.pinned)
            if drew:
                result.append(counts)
                continue
            known = ctx.memo[key] = counts
        ctx.memo[by_genes] = known
        result.append(known.copy())
    return result[0], result[1]


def mutate(counts: IntArray, ctx: Context, rate: float) -> IntArray:
    """A copy of `counts` with each unpinned job preempted with probability `rate`, refilled."""
    child = counts.copy()
    present = np.flatnonzero((child.sum(axis=1) > 0) & ~ctx.pinned)
    hit = present[ctx.rng.random(len(present)) < rate]
    if len(hit) == 0:
        return child
    child[hit] = 0
    others = ctx.everyone
    others[hit] = False
    fill(child, ctx, others)
    fill(child, ctx, ctx.everyone)
    reorder(child, ctx.layout, ctx.pinned)
    return child
