"""The population-based search behind the `pollux` policy, vectorized with numpy.

An individual is an allocation matrix of GPUs per node and job, jobs in repair
order (least attained service, then oldest, then lowest id). A population is
a `[size, nodes, jobs]` int8 array (jobs on the contiguous axis, so sums over
nodes and over jobs are both cheap) and every operator works on the whole
population at once. `SearchProblem.speedup` is a `[jobs, nodes used, GPUs]`
table built once per decision, so scoring a job is one lookup.

The operators follow Pollux's artifact (NSGA-II in pymoo), with these choices:

Objective
    One objective, FITNESS_p (`power_mean`) of the penalized speedups, with
    the sum of unpenalized speedups (the artifact's second objective, cluster
    utility, up to a constant) as a tie-break. The artifact keeps a Pareto
    front of (fitness, utility) but applies the solution with the best
    fitness, so ranking by fitness first applies the same rule.
Selection and survival
    Binary tournament on rank; `population` offspring per generation join
    the parents, duplicates are dropped, and the best `population` survive
    (elitist, like NSGA-II's survival).
Crossover
    Single point over jobs, two children per pair of parents.
Mutation
    As in the artifact: 10% of a child's job columns reset to the current
    allocation; in another 10% of columns each entry zeroed with probability
    0.1; then growth into free capacity: on a node with a free GPU, a job's
    entry grows with probability a + b - ab, where a = 1/(the individual's
    free nodes) and b = 1/(the free nodes the job holds GPUs on) if it holds
    GPUs there (else 0), to a uniform count between its value and the node's
    size. One change, for speed: on each free node only the jobs already
    there and the first job below its cap, in repair order, to grow do grow;
    the first is drawn directly (a geometric draw with probability a per
    job). In the artifact the other growers' GPUs are almost always cut again
    by repair: a job at its cap loses its growth, and capacity is served in
    repair order, so the first grower below its cap takes the free GPUs.
Repair, in order
    0. placement constraints: a job loses its GPUs on every node outside
       its mask (`SearchProblem.allowed`: `gpuq submit --node`, `--label`);
    1. interference: a multi-node job loses its GPUs on any node that already
       holds an earlier multi-node job. (The artifact also cleared single-node
       jobs listed after two distributed ones on that node; we clear only the
       distributed job, which is what the rule asks for.)
    2. caps: a job over its GPU cap or over `max_nodes` nodes keeps its GPUs on
       nodes taken in a random order until it is within both; then, where the
       problem has user budgets (`user_caps`: the `gpuq` policy's fair share),
       a user's jobs beyond its budget, later jobs in repair order first, keep
       GPUs on nodes in a random order until the user is within it;
    3. capacity: each node serves jobs in repair order, so later jobs lose
       GPUs first;
    4. minimum: a job left with fewer GPUs than its minimum (`min_gpus`,
       0 for the simulator's jobs) loses them all.
    No step adds GPUs, so none undoes an earlier one's guarantee.
Stopping
    At most `generations` generations, and earlier once the best fitness has
    not improved for `patience` generations (it cannot get worse: elitism).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Allocations = NDArray[np.int8]
"""GPUs per node and job (one individual) or per individual, node and job."""
Limits = NDArray[np.int16]
"""Per-node sizes and per-job caps."""

MAX_NODE_GPUS = 127
"""Largest node the int8 allocation matrices can describe."""
FloatArray = NDArray[np.float64]

SPEEDUP_EPSILON = 1e-3
"""Added to every speedup in the power mean, as in the artifact (keeps p < 0 finite)."""

RESET_RATE = 0.1
ZERO_ROW_RATE = 0.1
ZERO_ENTRY_RATE = 0.1


@dataclass(frozen=True, slots=True)
class SearchProblem:
    """One decision's search space: nodes by jobs (in repair order)."""

    base: Allocations
    """Current allocation, `[nodes, jobs]`."""
    node_gpus: Limits
    """GPUs per node, `[nodes]`."""
    max_gpus: Limits
    """Per-job GPU cap, `[jobs]`."""
    min_gpus: Limits
    """Per-job minimum, `[jobs]`: a job holds 0 GPUs or at least this many."""
    max_nodes: int
    """Most nodes one job may span."""
    speedup: FloatArray
    """SPEEDUP by `[job, nodes used, GPUs]`; covers every count the caps allow."""
    realloc_factor: FloatArray
    """REALLOC_FACTOR per job, applied when its column differs from `base`."""
    p: float
    """Power-mean exponent of FITNESS_p."""
    allowed: NDArray[np.bool_] | None = None
    """The nodes each job may use, `[nodes, jobs]` (placement constraints); None: all."""
    users: NDArray[np.intp] | None = None
    """Each job's user, an index into `user_caps`, `[jobs]`; None: no user budgets."""
    user_caps: Limits | None = None
    """Most GPUs each user's jobs may hold together, `[users]`; None: no user budgets."""

    def user_gpus(self, states: Allocations) -> NDArray[np.int64]:
        """GPUs each user holds in each individual, `[size, users]` (user budgets only)."""
        if self.users is None or self.user_caps is None:
            raise ValueError("the problem has no user budgets")
        gpus = states.sum(axis=1, dtype=np.int64)
        held = np.zeros((states.shape[0], len(self.user_caps)), dtype=np.int64)
        for user in range(len(self.user_caps)):
            held[:, user] = gpus[:, self.users == user].sum(axis=1)
        return held


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The final population, best first, with its scores."""

    population: Allocations
    fitness: FloatArray
    utility: FloatArray
    generations: int


def power_mean(speedups: FloatArray, p: float) -> FloatArray:
    """FITNESS_p over the last axis: `((sum (s + 1e-3)^p) / J)^(1/p)`; p = 0 is geometric.

    Computed in log space, so a very negative p approaches the minimum without
    overflow.
    """
    logs = np.log(speedups + SPEEDUP_EPSILON)
    count = speedups.shape[-1]
    if count == 0:
        return np.zeros(speedups.shape[:-1])
    if p == 0:
        return np.asarray(np.exp(logs.mean(axis=-1)), dtype=np.float64)
    scaled = p * logs
    top = scaled.max(axis=-1, keepdims=True)
    log_mean = np.log(np.exp(scaled - top).sum(axis=-1)) + top[..., 0] - np.log(count)
    return np.asarray(np.exp(log_mean / p), dtype=np.float64)


def job_speedups(problem: SearchProblem, states: Allocations) -> FloatArray:
    """Unpenalized SPEEDUP of every job in every individual, `[size, jobs]`."""
    jobs = problem.base.shape[1]
    _, max_nodes, max_gpus = problem.speedup.shape
    gpus = states.sum(axis=1, dtype=np.int16).astype(np.intp)
    nodes = (states > 0).sum(axis=1, dtype=np.int16).astype(np.intp)
    flat = ((np.arange(jobs) * max_nodes)[None, :] + nodes) * max_gpus + gpus
    return np.asarray(np.take(problem.speedup, flat), dtype=np.float64)


def evaluate(problem: SearchProblem, states: Allocations) -> tuple[FloatArray, FloatArray]:
    """(FITNESS_p with reallocation penalties, sum of speedups) per individual."""
    speedups = job_speedups(problem, states)
    changed = (states != problem.base).any(axis=1)
    penalized = np.where(changed, speedups * problem.realloc_factor, speedups)
    return power_mean(penalized, problem.p), speedups.sum(axis=1)


def crossover(first: Allocations, second: Allocations, rng: np.random.Generator) -> Allocations:
    """Single-point crossover over jobs: two children per pair of parents."""
    pairs, _, jobs = first.shape
    points = rng.integers(0, jobs, size=(pairs, 1, 1))
    take_second = np.arange(jobs) < points
    return np.concatenate(
        [np.where(take_second, second, first), np.where(take_second, first, second)]
    )


def mutate(problem: SearchProblem, states: Allocations, rng: np.random.Generator) -> Allocations:
    """The artifact's three mutations: reset rows, zero entries, grow into free GPUs."""
    size, _, jobs = states.shape
    states = states.copy()
    reset_p, reset_j = np.nonzero(rng.random((size, jobs)) < RESET_RATE)
    states[reset_p, :, reset_j] = problem.base[:, reset_j].T

    zero_p, zero_j = np.nonzero(rng.random((size, jobs)) < ZERO_ROW_RATE)
    if zero_p.size:
        rows = states[zero_p, :, zero_j]
        rows[rng.random(rows.shape) < ZERO_ENTRY_RATE] = 0
        states[zero_p, :, zero_j] = rows

    free_node = states.sum(axis=2, dtype=np.int16) < problem.node_gpus
    free_p, free_n = np.nonzero(free_node)
    if free_p.size:
        _grow(problem, states, free_node, free_p, free_n, rng)
    return states


def _grow(
    problem: SearchProblem,
    states: Allocations,
    free_node: NDArray[np.bool_],
    free_p: NDArray[np.intp],
    free_n: NDArray[np.intp],
    rng: np.random.Generator,
) -> None:
    """Growth into free GPUs, in place, on the free (individual, node) pairs given."""
    jobs = states.shape[2]
    prob_any = 1.0 / free_node.sum(axis=1)[free_p]
    # The first job below its cap, in repair order, to grow on each free node:
    # a geometric draw over those jobs.
    below_p, below_j = np.nonzero(states.sum(axis=1, dtype=np.int16) < problem.max_gpus)
    below_count = np.bincount(below_p, minlength=states.shape[0])
    below_start = np.cumsum(below_count) - below_count
    attempts = np.log(1.0 - rng.random(free_p.size)) / np.log1p(-np.minimum(prob_any, 1 - 1e-12))
    grower_f = np.flatnonzero(attempts < below_count[free_p])
    grower_j = below_j[below_start[free_p[grower_f]] + attempts[grower_f].astype(np.intp)]
    # Jobs already on a free node grow with probability a + b - ab.
    held_f, held_j = np.nonzero(states[free_p, free_n] > 0)
    if held_f.size:
        # How many free nodes each (individual, job) holds GPUs on.
        held_key = free_p[held_f] * jobs + held_j
        prob_held = 1.0 / np.bincount(held_key)[held_key]
        a = prob_any[held_f]
        grows = rng.random(held_f.size) < a + prob_held - a * prob_held
        grower_f = np.concatenate([grower_f, held_f[grows]])
        grower_j = np.concatenate([grower_j, held_j[grows]])
    # Each (free node, job) grows once: sorted distinct keys, like np.unique.
    marked = np.zeros(free_p.size * jobs, dtype=np.bool_)
    marked[grower_f * jobs + grower_j] = True
    keys = np.flatnonzero(marked)
    grower_f, grower_j = np.divmod(keys, jobs)
    where = (free_p[grower_f], free_n[grower_f], grower_j)
    current = states[where].astype(np.int64)
    sizes = problem.node_gpus[where[1]].astype(np.int64)
    raised = current + (rng.random(keys.size) * (sizes - current + 1)).astype(np.int64)
    states[where] = np.where(current < sizes, np.minimum(raised, sizes), current)


def repair(problem: SearchProblem, states: Allocations, rng: np.random.Generator) -> Allocations:
    """Make every individual feasible, in place: interference, caps, capacity (module docstring)."""
    if problem.allowed is not None:
        states[:, ~problem.allowed] = 0
    positive = states > 0
    nodes = positive.sum(axis=1, dtype=np.int16)
    occupied = positive & (nodes > 1)[:, None, :]
    shared_p, shared_n = np.nonzero(occupied.sum(axis=2, dtype=np.int16) > 1)
    if shared_p.size:
        rows = occupied[shared_p, shared_n]
        cleared = states[shared_p, shared_n]
        cleared[rows & (np.cumsum(rows, axis=1, dtype=np.int16) > 1)] = 0
        states[shared_p, shared_n] = cleared
        nodes = (states > 0).sum(axis=1, dtype=np.int16)

    gpus = states.sum(axis=1, dtype=np.int16)
    over_p, over_j = np.nonzero((gpus > problem.max_gpus) | (nodes > problem.max_nodes))
    if over_p.size:
        _keep_within(states, over_p, over_j, problem.max_gpus[over_j], problem.max_nodes, rng)
    if problem.user_caps is not None:
        _keep_user_budgets(problem, states, rng)

    full_p, full_n = np.nonzero(states.sum(axis=2, dtype=np.int16) > problem.node_gpus)
    if full_p.size:
        used = np.cumsum(states[full_p, full_n], axis=1, dtype=np.int16)
        np.minimum(used, problem.node_gpus[full_n][:, None], out=used)
        states[full_p, full_n] = np.diff(used, axis=1, prepend=np.int16(0))

    gpus = states.sum(axis=1, dtype=np.int16)
    short_p, short_j = np.nonzero((gpus > 0) & (gpus < problem.min_gpus))
    if short_p.size:
        states[short_p, :, short_j] = 0
    return states


def _keep_within(
    states: Allocations,
    over_p: NDArray[np.intp],
    over_j: NDArray[np.intp],
    caps: NDArray[np.int16],
    max_nodes: int,
    rng: np.random.Generator,
) -> None:
    """In place: each (individual, job) given keeps GPUs on nodes in a random order up to its cap.

    Also within `max_nodes` nodes.
    """
    rows = states[over_p, :, over_j]
    order = np.argsort(rng.random(rows.shape), axis=1)
    shuffled = np.take_along_axis(rows, order, axis=1)
    within = np.minimum(np.cumsum(shuffled, axis=1, dtype=np.int16), caps[:, None])
    shuffled = np.diff(within, axis=1, prepend=np.int16(0))
    spans = np.minimum(np.cumsum(shuffled > 0, axis=1, dtype=np.int16), max_nodes)
    shuffled[np.diff(spans, axis=1, prepend=np.int16(0)) == 0] = 0
    np.put_along_axis(rows, order, shuffled, axis=1)
    states[over_p, :, over_j] = rows


def _keep_user_budgets(
    problem: SearchProblem, states: Allocations, rng: np.random.Generator
) -> None:
    """In place: each user's jobs within its budget, later jobs in repair order losing first."""
    users, user_caps = problem.users, problem.user_caps
    if users is None or user_caps is None:
        return
    gpus = states.sum(axis=1, dtype=np.int16)
    allowed = gpus.copy()
    for user, cap in enumerate(user_caps):
        columns = np.flatnonzero(users == user)
        if not columns.size:
            continue
        mine = gpus[:, columns]
        before = np.cumsum(mine, axis=1, dtype=np.int16) - mine
        allowed[:, columns] = np.clip(np.int16(cap) - before, 0, mine)
    over_p, over_j = np.nonzero(allowed < gpus)
    if over_p.size:
        caps = allowed[over_p, over_j].astype(np.int16)
        _keep_within(states, over_p, over_j, caps, problem.max_nodes, rng)


def _rank(
    states: Allocations,
    scores: tuple[FloatArray, FloatArray],
    keys: list[bytes],
    keep: int,
    known: int = 0,
) -> tuple[Allocations, tuple[FloatArray, FloatArray], list[bytes]]:
    """The `keep` best distinct individuals, best first; ties keep their order.

    The first `known` individuals are already distinct from one another.
    """
    fitness, utility = scores
    seen = set(keys[:known])
    distinct = np.ones(len(keys), dtype=bool)
    for index in range(known, len(keys)):
        key = keys[index]
        if key in seen:
            distinct[index] = False
        else:
            seen.add(key)
    order = np.lexsort((-utility, -np.where(distinct, fitness, -np.inf)))
    order = order[distinct[order]][:keep]
    return states[order], (fitness[order], utility[order]), [keys[i] for i in order]


def _keys(states: Allocations) -> list[bytes]:
    """Each individual's bytes, to drop duplicates."""
    return [state.tobytes() for state in states]


def search(
    problem: SearchProblem,
    initial: Allocations,
    rng: np.random.Generator,
    *,
    population: int,
    generations: int,
    patience: int,
) -> SearchResult:
    """Run the genetic search from `initial` (repaired first); returns the final population."""
    states = repair(problem, np.concatenate([problem.base[None], initial]), rng)
    states, scores, keys = _rank(states, evaluate(problem, states), _keys(states), population)
    best, stale, done = scores[0][0], 0, 0
    pairs = max(population // 2, 1)
    while done < generations and stale < patience:
        done += 1
        picks = rng.integers(0, len(states), size=(2, 2 * pairs))
        parents = states[picks.min(axis=0)]
        children = crossover(parents[:pairs], parents[pairs:], rng)
        children = repair(problem, mutate(problem, children, rng), rng)
        child_scores = evaluate(problem, children)
        states, scores, keys = _rank(
            np.concatenate([states, children]),
            (
                np.concatenate([scores[0], child_scores[0]]),
                np.concatenate([scores[1], child_scores[1]]),
            ),
            keys + _keys(children),
            population,
            known=len(states),
        )
        if scores[0][0] > best:
            best, stale = scores[0][0], 0
        else:
            stale += 1
    return SearchResult(states, scores[0], scores[1], done)


def feasible(problem: SearchProblem, states: Allocations) -> NDArray[np.bool_]:
    """Whether each individual meets capacity, interference, caps and the node limit."""
    gpus = states.sum(axis=1)
    nodes = (states > 0).sum(axis=1)
    distributed = (states > 0) & (nodes > 1)[:, None, :]
    ok: NDArray[np.bool_] = (
        (states >= 0).all(axis=(1, 2))
        & (states.sum(axis=2) <= problem.node_gpus).all(axis=1)
        & (distributed.sum(axis=2) <= 1).all(axis=1)
        & (gpus <= problem.max_gpus).all(axis=1)
        & ((gpus == 0) | (gpus >= problem.min_gpus)).all(axis=1)
        & (nodes <= problem.max_nodes).all(axis=1)
    )
    if problem.allowed is not None:
        ok &= ~((states > 0) & ~problem.allowed).any(axis=(1, 2))
    if problem.user_caps is not None:
        ok &= (problem.user_gpus(states) <= problem.user_caps).all(axis=1)
    return ok
