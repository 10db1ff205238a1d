"""Pollux (Qiao et al., OSDI'21): goodput-driven elastic allocation, `pollux`.

Every decision maximizes FITNESS_p, the power mean (p = -1 by default) of
every active job's SPEEDUP, over allocation matrices (GPUs per node and job),
with a genetic search (`gpuq.policies.pollux.search`). Jobs are adaptive
(`capabilities.adaptive_jobs`): each picks its own batch size for the GPUs it gets, with
`gpuq.goodput`, so SPEEDUP is measured at the best batch size.

Rules, each tested in `tests/test_policy_pollux.py`:

SPEEDUP
    `SPEEDUP_j(A_j) = goodput_j(A_j) / goodput_j(a_f)`, both at the best batch
    size (`gpuq.goodput.SpeedupFunction`, with gradient accumulation allowed,
    as in the artifact's simulator). A job that is not adaptive keeps its own
    batch size (`fixed_batch_size`). Goodput depends on a placement through
    (nodes used, GPUs), so it is tabulated per job over every such pair its
    cap allows.
Fair share a_f
    The paper's "exclusive 1/J share of the cluster": ceil(GPUs / J) GPUs on
    the fewest nodes that hold them. The artifact puts those GPUs on
    ceil(#nodes x per-GPU share) = 1 node; the two agree whenever the share
    fits on one node (J >= 16 jobs on 16 nodes x 4 GPUs), and otherwise ours
    is a placement that exists. If a job's goodput at a_f is 0 (a batch size
    that cannot be split that far), its share is reduced to its cap, then to
    one GPU. The artifact also scales all speedups by (#nodes / #GPUs), a
    constant we leave out; only the 1e-3 guard of the power mean sees it.
Exploration prior
    A job with no goodput model yet is assumed perfectly scalable:
    SPEEDUP = GPUs / |a_f|, whatever the placement (as in the artifact).
FITNESS_p
    `((sum_j (SPEEDUP_j + 1e-3)^p) / J)^(1/p)` over running and pending jobs;
    p = 0 is the geometric mean.
REALLOC_FACTOR
    A job whose allocation differs from its current one on any node has its
    SPEEDUP multiplied by `max(T - R*delta, 0) / (T + delta)`, with T its age
    (`now - submit_time`), R its reallocations so far and delta the restart
    penalty (`restart_penalty`, else `state.restart_penalty`). Starting a
    pending job counts as a change, as in the artifact.
Constraints
    Node capacities; at most one multi-node job per node (interference
    avoidance); at most `MAX_NODES_PER_JOB` nodes per job; a per-job cap of
    min(max_gpus, max(max_gpu_factor x max_profiled_gpus, 1), batch limit,
    cluster size), where the batch limit is max_batch_size // min local batch
    (the user's batch size for a non-adaptive job) and is at least 1, raised
    to the job's minimum; a job gets 0 GPUs or at least `min_gpus` (0 in the
    simulator: any job may be left waiting or run on one GPU), and one whose
    minimum exceeds the cluster waits. A job with a placement constraint
    (`JobView.nodes`) gets GPUs only on its nodes, is capped at their GPUs,
    and waits when its minimum exceeds them.
Search
    A genetic search like the artifact's NSGA-II (`gpuq.policies.pollux.search`:
    population 100, up to 100 generations). The first decision starts from
    the current allocation; later ones also from the previous decision's final
    population (matched by job id and node name), as in the artifact. Repair
    grants capacity in the artifact's job order: least attained service
    first, then oldest, then lowest id. gpuq's changes, for speed at 160 jobs
    on 64 GPUs: the search stops once the best fitness has not improved for
    `patience` (10) generations (`bench/bench_pollux.py` compares the result
    with a search five times as long), and every initial population also
    holds a greedy allocation (`gpuq.policies.pollux.greedy`; `greedy=False`
    turns it off). The artifact's operators only grow jobs into GPUs that
    happen to be free, so without the seed they need many decisions to
    rebalance a full cluster.
Result
    The fittest allocation. Then, for each job whose GPU count it keeps but
    whose nodes it changes, the current allocation is restored if that stays
    feasible and does not lower the fitness, so nodes are never permuted for
    nothing.
Limits
    Nodes of at most 127 GPUs (allocations are int8 matrices).

Determinism: the random generator is seeded once and the warm-start
population is kept in the object, so decisions depend only on the seed and
the sequence of states. Models are memoized per goodput function, which
changes speed only.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuq.policies.confine import allowed_nodes, node_names
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView
from gpuq.policies.pollux.greedy import greedy_seed
from gpuq.policies.pollux.search import (
    MAX_NODE_GPUS,
    Allocations,
    SearchProblem,
    evaluate,
    feasible,
    job_speedups,
    search,
)
from gpuq.policies.pollux.tables import SpeedupTables, fair_share

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MAX_NODES_PER_JOB = 16
"""Most nodes one job may span (the artifact's limit)."""


def realloc_factor(age: float, restarts: int, penalty: float) -> float:
    """REALLOC_FACTOR: `max(age - restarts * penalty, 0) / (age + penalty)`."""
    age = max(age, 0.0)
    if age + penalty <= 0:
        return 1.0
    return max(age - restarts * penalty, 0.0) / (age + penalty)


def explore_limit(job: JobView, max_gpu_factor: int) -> int:
    """Pollux's exploration cap: `max_gpu_factor` times the most GPUs measured, one before any."""
    return max(max_gpu_factor * job.max_profiled_gpus, 1)


def gpu_cap(job: JobView, total_gpus: int, max_gpu_factor: int) -> int:
    """The most GPUs `job` may get now: user, exploration, batch and cluster limits."""
    explore = explore_limit(job, max_gpu_factor)
    min_local = max(job.local_bsz_bounds[0], 1)
    batch = job.max_batch_size if job.adaptive else job.batch_size
    by_batch = max(batch // min_local, 1) if batch > 0 else total_gpus
    return max(min(job.max_gpus, explore, by_batch, total_gpus), 0)


PRIOR_NOTE = " by the prior: no throughput model from its runner yet"
"""Said of a speedup a job without a model gets from Pollux's prior: every count scales."""


def speedup_note(job: JobView, speedup: float) -> str:
    """The note "speedup S over a fair share", saying so when it is the prior's, not measured.

    A job whose runner has reported without a model (its loader is not
    adaptive, or not yet) is sized by the prior, which takes every GPU count
    as perfectly scalable; before any report, `exploring` says why instead.
    """
    prior = job.goodput is None and job.max_profiled_gpus > 0
    return f"speedup {speedup:.2f} over a fair share" + (PRIOR_NOTE if prior else "")


def exploring(job: JobView, gpus: int, max_gpu_factor: int) -> str:
    """Why an adaptive job gets no more than `gpus`, when Pollux's exploration cap is why.

    A job is given at most `max_gpu_factor` times the most GPUs its runner has
    reported on, and one before it reports, so that a size never measured is
    reached a step at a time. Alone on an empty server a new job then starts
    on one GPU, and its speedup over a fair share reads low. "" where the cap
    does not hold it back.
    """
    explore = explore_limit(job, max_gpu_factor)
    if not job.adaptive or gpus < explore or gpus >= job.max_gpus:
        return ""
    asked = f"{max(job.min_gpus, 1)}-{job.max_gpus}"
    if job.max_profiled_gpus == 0:
        return f"; {gpus} of {asked} GPUs until its runner reports"
    return (
        f"; at most {explore} of {asked} GPUs"
        f" ({max_gpu_factor}x the {job.max_profiled_gpus} its runner has reported on)"
    )


def repair_order(jobs: Sequence[JobView]) -> list[JobView]:
    """The artifact's job order: least attained service, then oldest, then lowest id."""
    return sorted(jobs, key=lambda job: (job.attained_service, job.submit_time, job.id))


@dataclass(frozen=True, slots=True)
class Solution:
    """A search's answer: the jobs in repair order, the problem, and the fittest matrix."""

    jobs: list[JobView]
    problem: SearchProblem
    best: Allocations
    max_gpu_factor: int = 2
    """The exploration cap's factor the search ran with (`exploring`)."""


@dataclass(frozen=True, slots=True)
class Population:
    """The previous decision's final population, with its row and column keys."""

    job_ids: tuple[int, ...]
    node_names: tuple[str, ...]
    states: Allocations


def dump_population(population: Population) -> dict[str, Any]:
    """A population, JSON-ready (as `PolluxPolicy.save` writes it)."""
    states = np.ascontiguousarray(population.states, dtype=np.int8)
    return {
        "job_ids": list(population.job_ids),
        "node_names": list(population.node_names),
        "shape": list(states.shape),
        "states": base64.b64encode(states.tobytes()).decode("ascii"),
    }


def load_population(data: Mapping[str, Any]) -> Population:
    """A population as `dump_population` wrote it (KeyError, TypeError, ValueError if not)."""
    shape = tuple(int(n) for n in data["shape"])
    raw = base64.b64decode(data["states"], validate=True)
    states = np.frombuffer(raw, dtype=np.int8).reshape(shape).copy()
    job_ids = tuple(int(i) for i in data["job_ids"])
    node_names = tuple(str(n) for n in data["node_names"])
    if shape[1:] != (len(node_names), len(job_ids)):
        raise ValueError(f"a population of shape {shape} for {len(job_ids)} jobs")
    return Population(job_ids, node_names, states)


class PolluxPolicy:
    """Pollux's scheduler: maximize the power mean of goodput speedups (module docstring)."""

    name = "pollux"
    capabilities = Capabilities(adaptive_jobs=True, preemption=True, remembers=True)

    def __init__(
        self,
        p: float = -1.0,
        restart_penalty: float | None = None,
        population: int = 100,
        generations: int = 100,
        seed: int = 0,
        max_gpu_factor: int = 2,
        patience: int = 10,
        greedy: bool = True,
    ) -> None:
        if not math.isfinite(p):
            raise ValueError(f"p must be finite, got {p}")
        if population < 2 or generations < 0 or patience < 1:
            raise ValueError("need population >= 2, generations >= 0 and patience >= 1")
        self.p = p
        self.restart_penalty = restart_penalty
        self.population = population
        self.generations = generations
        self.seed = seed
        self.max_gpu_factor = max_gpu_factor
        self.patience = patience
        self.greedy = greedy
        self._rng = np.random.default_rng(seed)
        self._previous: Population | None = None
        self._tables = SpeedupTables()
        self.last_generations = 0
        """Generations the last decision ran (for benchmarks)."""

    def problem(self, state: ClusterState, now: float) -> tuple[list[JobView], SearchProblem]:
        """The jobs in repair order and the search problem for this instant."""
        jobs = repair_order(state.jobs)
        node_gpus = np.array([node.gpus for node in state.nodes], dtype=np.int16)
        if node_gpus.max() > MAX_NODE_GPUS:
            raise ValueError(f"nodes with more than {MAX_NODE_GPUS} GPUs are not supported")
        total = int(node_gpus.sum())
        mins = np.array([max(job.min_gpus, 0) for job in jobs], dtype=np.int16)
        caps = np.array([gpu_cap(job, total, self.max_gpu_factor) for job in jobs], dtype=np.int16)
        caps = np.maximum(caps, mins)  # a job that needs 4 GPUs is explored at 4, not 1
        caps[mins > total] = 0  # more than the cluster has: it waits
        allowed = None
        if any(job.nodes is not None for job in jobs):
            allowed = np.array([allowed_nodes(state, job) for job in jobs], dtype=bool).T
            reachable = (node_gpus[:, None] * allowed).sum(axis=0)  # GPUs of each job's nodes
            caps = np.minimum(caps, reachable).astype(np.int16)
            caps[mins > reachable] = 0  # more than its nodes have: it waits
        mins = np.minimum(mins, caps)
        max_nodes = min(MAX_NODES_PER_JOB, len(state.nodes))
        if jobs and all(job.spread == 1 for job in jobs):
            max_nodes = 1  # the daemon's jobs are one process each: one server's GPUs
        penalty = state.restart_penalty if self.restart_penalty is None else self.restart_penalty
        factors = np.array(
            [realloc_factor(now - job.submit_time, job.num_restarts, penalty) for job in jobs]
        )
        base = np.zeros((len(state.nodes), len(jobs)), dtype=np.int8)
        for row, job in enumerate(jobs):
            if any(job.allocation):
                if len(job.allocation) != len(state.nodes):
                    raise ValueError(
                        f"job {job.id}: allocation has {len(job.allocation)} entries "
                        f"for {len(state.nodes)} nodes"
                    )
                base[:, row] = job.allocation
        fair = fair_share(node_gpus, len(jobs))
        speedup = self._tables.build(jobs, caps, node_gpus, max_nodes, fair)
        problem = SearchProblem(
            base, node_gpus, caps, mins, max_nodes, speedup, factors, self.p, allowed
        )
        return jobs, problem

    def fitness(
        self, state: ClusterState, now: float, allocations: Mapping[int, Sequence[int]]
    ) -> float:
        """FITNESS_p of `allocations` (job id to GPUs per node) for this state."""
        if not state.jobs or not state.nodes:
            return 0.0
        jobs, problem = self.problem(state, now)
        matrix = np.zeros_like(problem.base)
        for row, job in enumerate(jobs):
            allocation = allocations.get(job.id, ())
            if any(allocation):
                matrix[:, row] = allocation
        return float(evaluate(problem, matrix[None])[0][0])

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Search for the fittest allocation matrix and return it as a Decision."""
        if not state.jobs or not state.nodes:
            return Decision()
        solution = self.solve(state, now)
        jobs, problem, best = solution.jobs, solution.problem, solution.best
        speedups = job_speedups(problem, best[None])[0]
        allocations: dict[int, tuple[int, ...]] = {}
        notes: dict[int, str] = {}
        for row, job in enumerate(jobs):
            gpus = int(best[:, row].sum())
            if gpus:
                allocations[job.id] = tuple(int(count) for count in best[:, row])
                nodes = int(np.count_nonzero(best[:, row]))
                where = "" if len(state.nodes) == 1 else f" on {nodes} node{'s' * (nodes > 1)}"
                held = exploring(job, gpus, self.max_gpu_factor)
                notes[job.id] = f"{speedup_note(job, speedups[row])}{where}{held}"
            elif job.min_gpus > problem.node_gpus.sum():
                notes[job.id] = (
                    f"needs {job.min_gpus} GPUs; the cluster has {problem.node_gpus.sum()}"
                )
            elif problem.allowed is not None and job.nodes is not None:
                mine = int((problem.node_gpus * problem.allowed[:, row]).sum())
                where = node_names(job.nodes)
                have = "has" if len(job.nodes) == 1 else "have"
                notes[job.id] = (
                    f"needs {job.min_gpus} GPUs; {where} {have} {mine}"
                    if job.min_gpus > mine
                    else f"waiting for GPUs on {where} (cap {int(problem.max_gpus[row])} GPUs)"
                )
            else:
                notes[job.id] = f"waiting (cap {int(problem.max_gpus[row])} GPUs)"
        return Decision(allocations=allocations, notes=notes)

    def solve(self, state: ClusterState, now: float) -> Solution:
        """Run the search for this instant (a state with jobs and nodes); the fittest matrix."""
        jobs, problem = self.problem(state, now)
        job_ids = tuple(job.id for job in jobs)
        node_names = tuple(node.name for node in state.nodes)
        initial = self._warm_start(job_ids, node_names)
        if self.greedy:
            initial = np.concatenate([greedy_seed(problem)[None], initial])
        result = search(
            problem,
            initial,
            self._rng,
            population=self.population,
            generations=self.generations,
            patience=self.patience,
        )
        self._previous = Population(job_ids, node_names, result.population)
        self.last_generations = result.generations
        best = keep_current_placements(problem, result.population[0])
        return Solution(jobs, problem, best, self.max_gpu_factor)

    def save(self) -> dict[str, Any]:
        """Its memory: the random generator and the last population (`Remembers`)."""
        saved: dict[str, Any] = {"version": 1, "rng": self._rng.bit_generator.state}
        if self._previous is not None:
            saved["previous"] = dump_population(self._previous)
        return saved

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned; ValueError if it is not that."""
        version = saved.get("version")
        if version != 1:
            raise ValueError(f"not a saved {self.name} policy: unknown version {version!r}")
        try:
            rng = np.random.default_rng()
            rng.bit_generator.state = saved["rng"]
            previous = load_population(saved["previous"]) if "previous" in saved else None
        except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
            raise ValueError(f"not a saved {self.name} policy: {exc}") from None
        self._rng, self._previous = rng, previous

    def _warm_start(self, job_ids: tuple[int, ...], node_names: tuple[str, ...]) -> Allocations:
        """The previous final population mapped onto this instant's jobs and nodes."""
        previous = self._previous
        if previous is None:
            return np.zeros((0, len(node_names), len(job_ids)), dtype=np.int8)
        old_jobs = {job_id: index for index, job_id in enumerate(previous.job_ids)}
        old_nodes = {name: index for index, name in enumerate(previous.node_names)}
        jobs = [(new, old_jobs[i]) for new, i in enumerate(job_ids) if i in old_jobs]
        nodes = [(new, old_nodes[n]) for new, n in enumerate(node_names) if n in old_nodes]
        states = np.zeros((len(previous.states), len(node_names), len(job_ids)), dtype=np.int8)
        if jobs and nodes:
            new_j, old_j = (np.array(side) for side in zip(*jobs, strict=True))
            new_n, old_n = (np.array(side) for side in zip(*nodes, strict=True))
            states[:, new_n[:, None], new_j[None, :]] = previous.states[
                :, old_n[:, None], old_j[None, :]
            ]
        return states


def keep_current_placements(problem: SearchProblem, best: Allocations) -> Allocations:
    """Restore each job's current nodes where the search only moved its GPUs around."""
    best = best.copy()
    fitness = evaluate(problem, best[None])[0][0]
    for row in range(best.shape[1]):
        current = problem.base[:, row]
        if best[:, row].sum() != current.sum() or (best[:, row] == current).all():
            continue
        candidate = best.copy()
        candidate[:, row] = current
        if not feasible(problem, candidate[None])[0]:
            continue
        candidate_fitness = evaluate(problem, candidate[None])[0][0]
        if candidate_fitness >= fitness:
            best, fitness = candidate, candidate_fitness
    return best


__all__ = [
    "MAX_NODES_PER_JOB",
    "PolluxPolicy",
    "Population",
    "Solution",
    "dump_population",
    "gpu_cap",
    "keep_current_placements",
    "load_population",
    "realloc_factor",
    "repair_order",
]
