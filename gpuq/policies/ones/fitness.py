"""ONES's score: Smallest Remaining Utilization First (SRUF, paper Eqs. 3-8).

The score of a candidate schedule S is its total remaining utilization,
`U(S) = sum over its running jobs of n_j * W_j / X_j(B_j)` in GPU-seconds,
where n_j is the job's GPU count, B_j its total batch, W_j its remaining work
in samples and X_j its throughput in samples per second. Lower is better.

Choices gpuq makes where the paper is silent or the simulator differs:

Throughput (a substitution, not ONES)
    ONES measures throughput on the configurations it has run and gives no
    model for the ones it has not. gpuq uses Pollux's fitted throughput model
    instead (`JobView.goodput.throughput`), on the job's actual node count, so
    the score also rewards locality. A job without a model is assumed to
    scale linearly from the median single-GPU throughput of the jobs that
    have one (1 sample/s if none has).
Remaining work and progress (the GPR predictor is not implemented)
    ONES predicts each job's progress p_j with a Gaussian-process regression
    and samples p_j ~ Beta(alpha_j, beta_j) (Alg. 1). gpuq has an oracle
    instead: `remaining_iterations * batch_size` samples in the simulator (an
    estimate in the daemon). To keep Alg. 1's structure, progress is sampled
    from a Beta whose mode is the oracle progress p* = done / total:
    alpha = 1 + kappa * p*, beta = 1 + kappa * (1 - p*), with kappa the
    `concentration` (pseudo-epochs of evidence; alpha, beta >= 1 keeps the
    Beta unimodal, as ONES's threshold does). Then W = total * (1 - p), so
    W equals the oracle at the mode, and an infinite concentration (a
    degenerate Beta) gives exactly the oracle: exact SRUF. `total` is the
    largest remaining work seen for the job, so p* counts from when the
    policy first saw it. A job with no estimate at all gets the median of the
    others' remaining work (1 if none has one), without noise.
Sampling (Alg. 1)
    Alg. 1 is Thompson sampling: draw every job's progress once, score every
    candidate in that sampled world, take the best. gpuq shares one draw per
    job among all the candidates compared (common random numbers), rather
    than drawing per candidate, so that candidates differ only by their
    schedules; independent draws would let noise, not structure, pick the
    winner, and every such change costs restarts.
Restart cost (a gpuq addition, on by default)
    ONES rescales in place in about a second and ignores the cost. In gpuq a
    reallocation costs `restart_penalty` seconds, so with `restart_cost` the
    score adds n_j * restart_penalty GPU-seconds for every running job whose
    node vector differs from the live schedule.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from gpuq.policies.interface import JobView
from gpuq.policies.ones.genome import IntArray, JobRules, Layout

if TYPE_CHECKING:
    from gpuq.goodput import GoodputFunction

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True, eq=False)
class Progress:
    """Each job's remaining work and the Beta its progress is sampled from."""

    remaining: FloatArray
    total: FloatArray
    alpha: FloatArray
    beta: FloatArray
    noisy: NDArray[np.bool_]

    @classmethod
    def of(
        cls, remaining: Sequence[float | None], total: Sequence[float], concentration: float
    ) -> Progress:
        """Progress for jobs with oracle `remaining` work (None: unknown) and `total` seen."""
        known = np.array([w is not None for w in remaining], dtype=np.bool_)
        work = np.array([w if w is not None else np.nan for w in remaining], dtype=np.float64)
        fallback = float(np.median(work[known])) if known.any() else 1.0
        work = np.where(known, np.maximum(work, 0.0), fallback)
        most = np.maximum(np.asarray(total, dtype=np.float64), work)
        done = np.where(most > 0, 1.0 - work / np.where(most > 0, most, 1.0), 0.0)
        noisy = known & math.isfinite(concentration) & (most > 0)
        kappa = concentration if math.isfinite(concentration) else 0.0
        return cls(work, most, 1.0 + kappa * done, 1.0 + kappa * (1.0 - done), noisy)

    def sample(self, rng: np.random.Generator) -> FloatArray:
        """One draw of every job's remaining work (shape (J,))."""
        if not self.noisy.any():
            return self.remaining.copy()
        progress = rng.beta(self.alpha, self.beta)
        return np.asarray(np.where(self.noisy, self.total * (1.0 - progress), self.remaining))


def throughput_table(
    jobs: Sequence[JobView],
    rules: JobRules,
    layout: Layout,
    memo: dict[Hashable, FloatArray] | None = None,
) -> FloatArray:
    """X[row, n, k]: samples/s of each job on n GPUs over k nodes; 0 where not allowed.

    `memo` keeps each modelled job's block between calls, by everything it
    depends on (model, allowed GPU counts and their batches, cluster shape);
    it is replaced by the blocks of this call.
    """
    table = np.zeros((len(jobs), layout.gpus + 1, layout.nodes + 1), dtype=np.float64)
    modelled: list[int] = []
    kept: dict[Hashable, FloatArray] = {}
    for row, job in enumerate(jobs):
        low, high = int(rules.n_min[row]), int(rules.n_max[row])
        if high == 0:
            continue
        gpus = np.arange(low, high + 1, dtype=np.int64)
        width = min(layout.nodes, high)
        if job.goodput is not None:
            modelled.append(row)
            key = (job.goodput, low, rules.batch[row, gpus].tobytes(), layout.node_gpus)
            block = None if memo is None else memo.get(key)
            if block is None:
                block = _block(job.goodput, rules.batch[row, gpus], gpus, width)
            kept[key] = block
        else:
            nodes = np.arange(1, width + 1, dtype=np.int64)
            n_grid, k_grid = np.meshgrid(gpus, nodes, indexing="ij")
            block = np.where(k_grid <= n_grid, n_grid.astype(np.float64), 0.0)
        table[row, low : high + 1, 1 : width + 1] = block
    if memo is not None:
        memo.clear()
        memo.update(kept)
    single = [table[row, rules.n_min[row], 1] / rules.n_min[row] for row in modelled]
    reference = float(np.median(single)) if single else 1.0
    for row, job in enumerate(jobs):
        if job.goodput is None:
            table[row] *= reference
    return table


def _block(model: GoodputFunction, batch: IntArray, gpus: IntArray, width: int) -> FloatArray:
    """Samples/s of a modelled job on each allowed GPU count (rows) over 1..width nodes."""
    nodes = np.arange(1, width + 1, dtype=np.int64)
    n_grid, k_grid = np.meshgrid(gpus, nodes, indexing="ij")
    local = batch / gpus
    values = np.asarray(
        model.throughput(k_grid, n_grid, np.broadcast_to(local[:, None], n_grid.shape), 0),
        dtype=np.float64,
    )
    return np.where(k_grid <= n_grid, np.maximum(values, 0.0), 0.0)


@dataclass(frozen=True, slots=True, eq=False)
class Census:
    """Per (candidate, job): GPUs, nodes spanned, and whether the job moved."""

    gpus: IntArray
    spans: IntArray
    moved: NDArray[np.bool_]


def census(counts: IntArray, live: IntArray | None = None) -> Census:
    """Each candidate's GPUs and nodes per job, from GPUs per (candidate, row, node).

    `live` is the live schedule's GPUs per (row, node); a running job moved if
    its node vector differs from it.
    """
    gpus = counts.sum(axis=2)
    if live is None:
        moved = np.zeros(gpus.shape, dtype=np.bool_)
    else:
        moved = (gpus > 0) & (counts != live[None, :, :]).any(axis=2)
    return Census(gpus, np.count_nonzero(counts, axis=2), moved)


def utilization(
    counted: Census, table: FloatArray, work: FloatArray, restart_penalty: float = 0.0
) -> FloatArray:
    """SRUF score of each candidate: sum of n_j * W_j / X_j, given work (J,) or (C, J).

    With a positive `restart_penalty`, each job that moved costs
    n_j * restart_penalty GPU-seconds more.
    """
    gpus = counted.gpus
    speed = table[np.arange(gpus.shape[1])[None, :], gpus, counted.spans]
    running = gpus > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.where(running, gpus * work / speed, 0.0)
    cost = np.where(running & (speed <= 0), np.inf, cost)
    score = cost.sum(axis=1)
    if restart_penalty > 0:
        score = score + (counted.moved * gpus).sum(axis=1) * restart_penalty
    return np.asarray(score, dtype=np.float64)
