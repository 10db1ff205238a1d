"""A greedy allocation that seeds the `pollux` search (gpuq's addition to Pollux).

The artifact's genetic operators grow jobs only into GPUs that happen to be
free, so in a full cluster it takes many generations to move GPUs from one
job to another. gpuq therefore adds one greedy individual to every initial
population; the search is elitist, so its answer is never less fit than this
seed; with p < 0 the seed, like FITNESS_p, starts waiting jobs before it
grows running ones.

Counts
    Each job's value at c GPUs is its term of FITNESS_p, `sign(p) (s + 1e-3)^p`
    (log for p = 0), where s is its SPEEDUP on the fewest nodes holding c
    GPUs, times REALLOC_FACTOR unless c is its current count (then its current
    placement, unpenalized). Starting from nothing, the greedy repeatedly
    gives some job the step up (to any count within its cap, at least its
    minimum, and the GPUs left, and its user's budget where the problem has
    user budgets) with the best gain per GPU, until no step gains.
Placement
    Jobs that keep their count keep their current GPUs. The others, largest
    first, go best-fit on one node when they fit on one, else on the nodes
    with the most free GPUs that hold no other multi-node job; a job gets
    fewer GPUs if they do not fit. A job goes only on the nodes its
    placement constraint allows (`SearchProblem.allowed`). Repair then makes
    the seed feasible like any other individual.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from gpuq.policies.pollux.search import (
    SPEEDUP_EPSILON,
    Allocations,
    FloatArray,
    SearchProblem,
)
from gpuq.policies.pollux.tables import fewest_nodes


def fitness_terms(speedups: FloatArray, p: float) -> FloatArray:
    """Each job's additive term of FITNESS_p: its sum is monotone in the power mean."""
    shifted = speedups + SPEEDUP_EPSILON
    if p == 0:
        return np.asarray(np.log(shifted), dtype=np.float64)
    return np.asarray(np.sign(p) * shifted**p, dtype=np.float64)


def greedy_counts(problem: SearchProblem) -> NDArray[np.intp]:
    """GPUs per job from the best-gain-per-GPU greedy (module docstring)."""
    jobs = problem.base.shape[1]
    _, node_slots, width = problem.speedup.shape
    current = problem.base.sum(axis=0).astype(np.intp)
    current_nodes = (problem.base > 0).sum(axis=0)
    counts = np.arange(width)
    nodes = fewest_nodes(problem.node_gpus, width - 1)
    placeable = (nodes < node_slots) & (nodes <= problem.max_nodes)
    speedup = problem.speedup[:, np.minimum(nodes, node_slots - 1), counts]
    speedup = speedup * problem.realloc_factor[:, None]
    rows = np.arange(jobs)
    kept = (current > 0) & (current < width)
    speedup[rows[kept], current[kept]] = problem.speedup[
        rows[kept], np.minimum(current_nodes[kept], node_slots - 1), current[kept]
    ]
    value = fitness_terms(speedup, problem.p)
    allowed = (counts[None, :] <= problem.max_gpus[:, None]) & placeable[None, :]
    allowed &= (counts[None, :] == 0) | (counts[None, :] >= problem.min_gpus[:, None])
    value = np.where(allowed, value, -np.inf)

    chosen = np.zeros(jobs, dtype=np.intp)
    left = int(problem.node_gpus.sum())
    users = problem.users
    user_left = None if problem.user_caps is None else problem.user_caps.astype(np.intp)
    while left > 0:
        step = counts[None, :] - chosen[:, None]
        now = value[rows, chosen][:, None]
        fits = (step > 0) & (step <= left)
        if user_left is not None and users is not None:
            fits &= step <= user_left[users][:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            gain = np.where(fits, (value - now) / step, -np.inf)
        best = int(np.argmax(gain))
        job, count = divmod(best, width)
        if not gain[job, count] > 0:
            break
        left -= count - int(chosen[job])
        if user_left is not None and users is not None:
            user_left[users[job]] -= count - int(chosen[job])
        chosen[job] = count
    return chosen


def place(problem: SearchProblem, counts: NDArray[np.intp]) -> Allocations:
    """An allocation matrix giving each job (up to) its count (module docstring)."""
    nodes, jobs = problem.base.shape
    state = np.zeros((nodes, jobs), dtype=np.int8)
    free = problem.node_gpus.astype(np.int64)
    multi_node = np.zeros(nodes, dtype=bool)
    current = problem.base.sum(axis=0)
    keep = (counts == current) & (current > 0)
    for kept in np.flatnonzero(keep):
        column = problem.base[:, kept]
        state[:, kept] = column
        free -= column
        if np.count_nonzero(column) > 1:
            multi_node |= column > 0
    others = [int(job) for job in np.flatnonzero((counts > 0) & ~keep)]
    everywhere = np.ones(nodes, dtype=bool)
    for job in sorted(others, key=lambda j: -int(counts[j])):
        want = int(counts[job])
        mask = everywhere if problem.allowed is None else problem.allowed[:, job]
        fits = np.flatnonzero((free >= want) & mask)
        if fits.size:
            node = int(fits[np.argmin(free[fits])])
            state[node, job] = want
            free[node] -= want
            continue
        open_nodes = np.flatnonzero((free > 0) & ~multi_node & mask)
        open_nodes = open_nodes[np.argsort(-free[open_nodes], kind="stable")]
        open_nodes = open_nodes[: problem.max_nodes]
        before = np.cumsum(free[open_nodes]) - free[open_nodes]
        taken = np.clip(want - before, 0, free[open_nodes])
        used = open_nodes[taken > 0]
        state[used, job] = taken[taken > 0]
        free[used] -= taken[taken > 0]
        if used.size > 1:
            multi_node[used] = True
    return state


def greedy_seed(problem: SearchProblem) -> Allocations:
    """The greedy individual: counts from `greedy_counts`, placed by `place`."""
    return place(problem, greedy_counts(problem))
