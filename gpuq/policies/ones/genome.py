"""ONES's genome: one gene per GPU, holding a job and its per-GPU batch size.

The paper encodes a schedule as a vector indexed by GPU (its Fig. 1, Eqs. 1-2);
gpuq's `Genome` is two integer arrays over the cluster's GPUs in node order:
`jobs[g]` is the id of the job whose worker runs on GPU g (`EMPTY` if none)
and `local_bsz[g]` that worker's batch size (0 if none). A job's total batch
is the sum of its workers' batches and its GPU count the number of its genes,
so no GPU can ever hold two jobs (ONES's Eq. 4: no sharing).

`encode` and `decode` convert to and from per-job node vectors plus a total
batch (`Assignment`), the form `Decision` uses; GPUs within a node are
interchangeable, so `decode(encode(s)) == s` for every schedule that fits.

For speed, the operators work on the same schedule as `counts`, the GPUs per
(job row, node), and `to_counts`/`from_counts` convert (a genome's per-GPU
batches follow from its jobs' totals, split evenly). `JobRules` holds, per
job, which GPU counts its current limit allows and the batch it then runs
with; `normalize` repairs counts to respect them, `reorder` packs each job
onto as few nodes as possible, and `violations` checks a genome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

EMPTY = -1
"""The job id of a GPU no job uses."""

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


class Assignment(NamedTuple):
    """A job's GPUs per node (one entry per node) and its total batch size."""

    allocation: tuple[int, ...]
    batch: int


class Layout:
    """The cluster's GPUs in node order: which node each GPU index is on."""

    __slots__ = ("_covered", "capacity_order", "node_gpus", "node_of_gpu", "starts")

    def __init__(self, node_gpus: Sequence[int]) -> None:
        self.node_gpus: tuple[int, ...] = tuple(int(n) for n in node_gpus)
        self.node_of_gpu: IntArray = np.repeat(
            np.arange(len(self.node_gpus), dtype=np.int64), self.node_gpus
        )
        self.starts: IntArray = np.concatenate(([0], np.cumsum(self.node_gpus)[:-1])).astype(
            np.int64
        )
        self.capacity_order: IntArray = np.sort(np.asarray(self.node_gpus, dtype=np.int64))[::-1]
        self._covered: IntArray = np.cumsum(self.capacity_order)

    @property
    def gpus(self) -> int:
        """GPUs in the cluster."""
        return len(self.node_of_gpu)

    @property
    def nodes(self) -> int:
        """Nodes in the cluster."""
        return len(self.node_gpus)

    def fewest_nodes(self, gpus: IntArray) -> IntArray:
        """For each GPU count, the fewest nodes that together have that many GPUs."""
        return np.searchsorted(self._covered, gpus).astype(np.int64) + 1


@dataclass(slots=True, eq=False)
class Genome:
    """A candidate schedule: the job id and per-GPU batch on every GPU."""

    jobs: IntArray
    local_bsz: IntArray

    @classmethod
    def empty(cls, gpus: int) -> Genome:
        """A schedule with every GPU idle."""
        return cls(np.full(gpus, EMPTY, dtype=np.int64), np.zeros(gpus, dtype=np.int64))


def split_batch(batch: int, workers: int) -> IntArray:
    """`batch` split over `workers` as evenly as integers allow, larger shares first."""
    shares = np.full(workers, batch // workers, dtype=np.int64)
    shares[: batch % workers] += 1
    return shares


def encode(schedule: Mapping[int, Assignment], layout: Layout, *, strict: bool = True) -> Genome:
    """The genome of `schedule`: each job on the lowest free GPUs of its nodes.

    With `strict`, a schedule that over-commits a node or gives a worker no
    sample raises ValueError; otherwise workers that do not fit are dropped
    (for live states built by someone else) and batches are raised to one
    sample per worker.
    """
    genome = Genome.empty(layout.gpus)
    free = list(layout.node_gpus)
    for job_id in sorted(schedule):
        allocation, batch = schedule[job_id]
        slots: list[int] = []
        for node, count in enumerate(allocation[: layout.nodes]):
            fits = min(count, free[node])
            if fits < count and strict:
                raise ValueError(f"job {job_id}: node {node} has {free[node]} free GPUs")
            start = layout.starts[node] + layout.node_gpus[node] - free[node]
            slots.extend(range(start, start + fits))
            free[node] -= fits
        if not slots:
            continue
        if batch < len(slots):
            if strict:
                raise ValueError(f"job {job_id}: batch {batch} < {len(slots)} workers")
            batch = len(slots)
        genome.jobs[slots] = job_id
        genome.local_bsz[slots] = split_batch(batch, len(slots))
    return genome


def decode(genome: Genome, layout: Layout) -> dict[int, Assignment]:
    """Every job in `genome` with its GPUs per node and total batch."""
    schedule: dict[int, Assignment] = {}
    used = genome.jobs != EMPTY
    for job_id in np.unique(genome.jobs[used]).tolist():
        mine = genome.jobs == job_id
        counts = np.bincount(layout.node_of_gpu[mine], minlength=layout.nodes)
        batch = int(genome.local_bsz[mine].sum())
        schedule[int(job_id)] = Assignment(tuple(int(c) for c in counts), batch)
    return schedule


@dataclass(frozen=True, slots=True, eq=False)
class JobRules:
    """Per-job limits for one decision, as arrays indexed by row (ids sorted).

    `batch[row, n]` is the total batch the job runs with on n GPUs under its
    current limit, 0 where n GPUs are not allowed; the allowed counts form the
    interval `[n_min[row], n_max[row]]` (`n_max` 0: the job cannot run).
    `local_min`/`local_max` are the per-GPU bounds, for checking invariants.
    """

    ids: IntArray
    batch: IntArray
    n_min: IntArray
    n_max: IntArray
    local_min: IntArray
    local_max: IntArray

    def rows(self, job_ids: IntArray) -> IntArray:
        """Row of each id in `job_ids`; -1 for EMPTY or ids not in the table."""
        found = np.searchsorted(self.ids, job_ids)
        found = np.minimum(found, max(len(self.ids) - 1, 0))
        if len(self.ids) == 0:
            return np.full(job_ids.shape, -1, dtype=np.int64)
        hit = (self.ids[found] == job_ids) & (job_ids != EMPTY)
        return np.where(hit, found, -1).astype(np.int64)


def to_counts(genome: Genome, rules: JobRules, layout: Layout) -> tuple[IntArray, IntArray]:
    """GPUs per (row, node) and total batch per row of the jobs of `rules` in `genome`.

    Genes of jobs not in `rules` (finished jobs) are ignored.
    """
    rows = rules.rows(genome.jobs)
    mine = rows >= 0
    jobs = len(rules.ids)
    flat = rows[mine] * layout.nodes + layout.node_of_gpu[mine]
    counts = np.bincount(flat, minlength=jobs * layout.nodes).reshape(jobs, layout.nodes)
    batch = np.bincount(rows[mine], weights=genome.local_bsz[mine], minlength=jobs)
    return counts.astype(np.int64), batch.astype(np.int64)


def _genes(counts: IntArray, layout: Layout) -> tuple[IntArray, IntArray]:
    """`(row, slot)` of every worker in `counts`: lowest rows first on each node."""
    rows, nodes = np.nonzero(counts.T)[::-1]
    sizes = counts[rows, nodes]
    worker_rows = np.repeat(rows, sizes)
    worker_nodes = np.repeat(nodes, sizes)
    used = np.bincount(nodes, weights=sizes, minlength=layout.nodes).astype(np.int64)
    before = np.concatenate(([0], np.cumsum(used)[:-1]))
    slots = layout.starts[worker_nodes] + np.arange(len(worker_rows)) - before[worker_nodes]
    return worker_rows, slots


def gene_rows(counts: IntArray, layout: Layout) -> IntArray:
    """The job row on each GPU of `from_counts(counts, ...)` (`EMPTY` where idle).

    Crossover only needs which job each gene holds; this skips the batches.
    """
    genes = np.full(layout.gpus, EMPTY, dtype=np.int64)
    rows, slots = _genes(counts, layout)
    genes[slots] = rows
    return genes


def counts_of_rows(genes: IntArray, jobs: int, layout: Layout) -> IntArray:
    """GPUs per (row, node) of a gene-row vector (`gene_rows`); `EMPTY` genes are idle."""
    mine = genes >= 0
    flat = genes[mine] * layout.nodes + layout.node_of_gpu[mine]
    counts = np.bincount(flat, minlength=jobs * layout.nodes).reshape(jobs, layout.nodes)
    return counts.astype(np.int64)


def from_counts(counts: IntArray, batch: IntArray, rules: JobRules, layout: Layout) -> Genome:
    """The genome with `counts[row, node]` workers of each job, lowest rows first on each node.

    Each job's total `batch[row]` is split evenly over its workers.
    """
    genome = Genome.empty(layout.gpus)
    if not counts.any():
        return genome
    worker_rows, slots = _genes(counts, layout)
    order = np.argsort(worker_rows, kind="stable")
    ranked = worker_rows[order]
    first = np.searchsorted(ranked, ranked)
    workers = counts.sum(axis=1)
    share = batch[ranked] // workers[ranked] + (
        np.arange(len(ranked)) - first < batch[ranked] % workers[ranked]
    )
    genome.jobs[slots[order]] = rules.ids[ranked]
    genome.local_bsz[slots[order]] = share
    return genome


class Candidate(NamedTuple):
    """A schedule kept between decisions: GPUs per (job, node) and batches, by job id.

    `candidate_counts` under the next decision's rules gives exactly what
    `to_counts` gives for the same schedule's genome (`from_counts`), without
    building the genes.
    """

    ids: IntArray
    counts: IntArray
    batch: IntArray


def candidate(counts: IntArray, rules: JobRules) -> Candidate:
    """`counts` (rows of `rules`) with each running job's batch under its rules."""
    batch = np.where(counts.any(axis=1), rule_batches(counts, rules), 0)
    return Candidate(rules.ids, counts, batch)


def candidate_counts(kept: Candidate, rules: JobRules, layout: Layout) -> tuple[IntArray, IntArray]:
    """GPUs per (row, node) and batch per row of `kept`'s jobs that `rules` still has."""
    rows = rules.rows(kept.ids)
    mine = rows >= 0
    counts = np.zeros((len(rules.ids), layout.nodes), dtype=np.int64)
    batch = np.zeros(len(rules.ids), dtype=np.int64)
    counts[rows[mine]] = kept.counts[mine]
    batch[rows[mine]] = kept.batch[mine]
    return counts, batch


def rule_batches(counts: IntArray, rules: JobRules) -> IntArray:
    """Each row's total batch under its rules for the GPUs `counts` gives it."""
    return np.asarray(rules.batch[np.arange(len(rules.ids)), counts.sum(axis=1)], dtype=np.int64)


def drop_from(row_counts: IntArray, workers: int) -> None:
    """Remove `workers` from one job's node vector, from its smallest groups first."""
    for node in np.lexsort((-np.arange(len(row_counts)), row_counts)).tolist():
        if workers <= 0:
            return
        gone = min(workers, int(row_counts[node]))
        row_counts[node] -= gone
        workers -= gone


def normalize(counts: IntArray, rules: JobRules, fixed: BoolArray | None = None) -> None:
    """Repair `counts` in place so every job runs on a GPU count its rules allow.

    Jobs below their fewest allowed GPUs (or not allowed to run) are removed;
    jobs above their most allowed GPUs shed workers from their smallest
    groups. Batches then follow from `rule_batches`. `fixed` rows (jobs whose
    live configuration must not change yet) are left alone.
    """
    gpus = counts.sum(axis=1)
    free = np.ones(len(gpus), dtype=np.bool_) if fixed is None else ~fixed
    counts[free & (gpus > 0) & ((gpus < rules.n_min) | (rules.n_max == 0))] = 0
    for row in np.flatnonzero(free & (gpus > rules.n_max) & (rules.n_max > 0)).tolist():
        drop_from(counts[row], int(gpus[row] - rules.n_max[row]))


def place_on_nodes(idle: IntArray, workers: int, previous: IntArray) -> IntArray:
    """How many of `workers` go on each node: one node if any fits, else fewest nodes.

    Among nodes that fit, prefer where the job already has most workers, then
    the tightest fit; otherwise take nodes with the most idle GPUs first.
    """
    take = np.zeros_like(idle)
    fits = np.flatnonzero(idle >= workers)
    if len(fits):
        if previous.any():
            best = fits[np.lexsort((fits, idle[fits], -previous[fits]))[0]]
        else:
            best = fits[np.argmin(idle[fits])]
        take[best] = workers
        return take
    left = workers
    for node in np.lexsort((np.arange(len(idle)), -previous, -idle)).tolist():
        if left == 0:
            break
        take[node] = min(left, int(idle[node]))
        left -= int(take[node])
    return take


def reorder(counts: IntArray, layout: Layout, fixed: BoolArray | None = None) -> None:
    """Pack each scattered job onto as few nodes as possible, in place (Fig. 10).

    A job already on its fewest possible nodes stays where it is (moving it
    would cost a restart for nothing), and so do `fixed` rows. The others are
    lifted out and placed again, largest first, then in order of their first
    node (the paper packs "in the order of the occurrence of each job"), each
    on one node if one fits and otherwise on the emptiest nodes.
    """
    gpus = counts.sum(axis=1)
    spans = (counts != 0).sum(axis=1)
    loose = spans > layout.fewest_nodes(gpus)  # idle rows: 0 > 1 is False
    if fixed is not None:
        loose &= ~fixed
    scattered = np.flatnonzero(loose)
    if len(scattered) == 0:
        return
    previous = counts[scattered].copy()
    counts[scattered] = 0
    idle = np.asarray(layout.node_gpus, dtype=np.int64) - counts.sum(axis=0)
    first_node = np.argmax(previous > 0, axis=1)
    for i in np.lexsort((scattered, first_node, -gpus[scattered])).tolist():
        take = place_on_nodes(idle, int(gpus[scattered[i]]), previous[i])
        counts[scattered[i]] = take
        idle -= take


def violations(genome: Genome, rules: JobRules, layout: Layout) -> list[str]:
    """Every way `genome` breaks its rules (empty when it respects them)."""
    problems: list[str] = []
    if genome.jobs.shape != (layout.gpus,) or genome.local_bsz.shape != (layout.gpus,):
        return [f"genome has {genome.jobs.shape} genes for {layout.gpus} GPUs"]
    rows = rules.rows(genome.jobs)
    for row in np.unique(rows[rows >= 0]).tolist():
        mine = rows == row
        n = int(mine.sum())
        job_id = int(rules.ids[row])
        if not rules.n_min[row] <= n <= rules.n_max[row]:
            problems.append(
                f"job {job_id}: {n} GPUs outside [{rules.n_min[row]}, {rules.n_max[row]}]"
            )
            continue
        local = genome.local_bsz[mine]
        if int(local.sum()) != int(rules.batch[row, n]):
            problems.append(f"job {job_id}: batch {int(local.sum())} != {int(rules.batch[row, n])}")
        if local.min() < rules.local_min[row] or local.max() > rules.local_max[row]:
            problems.append(f"job {job_id}: per-GPU batch outside its bounds")
    unknown = (rows < 0) & (genome.jobs != EMPTY)
    if unknown.any():
        problems.append(f"unknown jobs {sorted(set(genome.jobs[unknown].tolist()))}")
    if ((genome.jobs == EMPTY) & (genome.local_bsz != 0)).any():
        problems.append("an idle GPU has a batch")
    return problems
