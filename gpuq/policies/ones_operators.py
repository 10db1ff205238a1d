"""ONES's evolution operators: refresh, uniform crossover, uniform mutation (section 3.2.2).

The operators work on a candidate's `counts` (GPUs per job row and node;
crossover takes the GPU-indexed genomes, as in the paper). Each returns
candidates that fit every node and keep every job within its allowed GPU
counts and batch limit (`JobRules`), and leaves pinned jobs (deployment
gating) on their live GPUs (`pin`); reorder lives in `ones_genome`.
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

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpuq.policies.ones_fitness import FloatArray, Progress
from gpuq.policies.ones_genome import (
    Genome,
    IntArray,
    JobRules,
    Layout,
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

    @property
    def everyone(self) -> BoolArray:
        """A mask selecting every job."""
        return np.ones(len(self.rules.ids), dtype=np.bool_)


def fill(counts: IntArray, ctx: Context, eligible: BoolArray, scale_up: bool = True) -> None:
    """Give idle GPUs to the jobs with the largest sampled utilization gain, in place.

    Only `eligible` jobs gain GPUs; without `scale_up` only waiting jobs do.
    """
    rules, layout = ctx.rules, ctx.layout
    idle = ctx.capacity - counts.sum(axis=0)
    gpus = counts.sum(axis=1)
    spans = np.count_nonzero(counts, axis=1)
    rows = np.arange(len(rules.ids))
    allowed = eligible & ~ctx.pinned & (rules.n_max > 0)
    while (free := int(idle.sum())) > 0:
        grow = np.where(gpus == 0, rules.n_min, 1)
        wider = gpus + grow
        ok = allowed & (wider <= rules.n_max) & (grow <= free)
        if not scale_up:
            ok &= gpus == 0
        if not ok.any():
            return
        room_at_home = ((counts > 0) & (idle > 0)).any(axis=1)
        covered = np.cumsum(np.sort(idle)[::-1])
        start_spans = np.searchsorted(covered, rules.n_min) + 1
        new_spans = np.where(gpus == 0, start_spans, np.where(room_at_home, spans, spans + 1))
        new_spans = np.clip(new_spans, 1, layout.nodes)
        faster = (
            ctx.table[rows, np.minimum(wider, layout.gpus), new_spans]
            - ctx.table[rows, gpus, spans]
        )
        work = ctx.progress.sample(ctx.rng)
        gain = np.where(ok, faster / (np.maximum(grow, 1) * np.maximum(work, 1e-12)), -np.inf)
        best = int(np.argmax(gain))
        if not gain[best] > 0:
            return
        if gpus[best] > 0 and room_at_home[best]:
            home = np.flatnonzero((counts[best] > 0) & (idle > 0))
            take = np.zeros_like(idle)
            take[home[np.argmax(counts[best, home])]] = 1
        else:
            take = place_on_nodes(idle, int(grow[best]), counts[best])
        counts[best] += take
        idle -= take
        gpus[best] += int(grow[best])
        spans[best] = np.count_nonzero(counts[best])


def place_new_jobs(counts: IntArray, ctx: Context) -> None:
    """Step (3) of refresh: new jobs first, taking GPUs from the largest jobs."""
    rules = ctx.rules
    gpus = counts.sum(axis=1)
    free = int(ctx.capacity.sum() - gpus.sum())
    for row in ctx.arrival.tolist():
        if not ctx.new[row] or gpus[row] > 0 or rules.n_max[row] == 0:
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
    if not ctx.pinned.any():
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


def refresh(genome: Genome, ctx: Context) -> IntArray:
    """Bring a candidate up to date with the jobs: steps (1)-(4), then reorder.

    Returns the refreshed candidate's GPUs per (row, node).
    """
    counts, batch = to_counts(genome, ctx.rules, ctx.layout)
    gpus = counts.sum(axis=1)
    for row in np.flatnonzero((gpus > 0) & (batch > ctx.limit) & ~ctx.pinned).tolist():
        keep = int(gpus[row] * ctx.limit[row] // batch[row])
        drop_from(counts[row], int(gpus[row]) - keep)
    _repair(counts, ctx)
    place_new_jobs(counts, ctx)
    fill(counts, ctx, ctx.everyone)
    reorder(counts, ctx.layout, ctx.pinned)
    return counts


def crossover(a: Genome, b: Genome, ctx: Context) -> tuple[IntArray, IntArray]:
    """Two children of `a` and `b` by uniform crossover, repaired and filled."""
    first = ctx.rng.random(len(a.jobs)) < 0.5
    children = (
        Genome(np.where(first, a.jobs, b.jobs), np.where(first, a.local_bsz, b.local_bsz)),
        Genome(np.where(first, b.jobs, a.jobs), np.where(first, b.local_bsz, a.local_bsz)),
    )
    result = []
    for child in children:
        counts, _ = to_counts(child, ctx.rules, ctx.layout)
        _repair(counts, ctx)
        fill(counts, ctx, ctx.everyone)
        reorder(counts, ctx.layout, ctx.pinned)
        result.append(counts)
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
