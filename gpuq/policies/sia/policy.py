"""Sia (Jayaram Subramanya et al., SOSP'23): heterogeneity-aware goodput scheduling, `sia`.

Every decision picks each job's GPU type and count at once: one small
binary ILP over (job, configuration) pairs, rather than Pollux's genetic
search over placements, then a placer maps the chosen configurations to
nodes. Jobs are adaptive (`capabilities.adaptive_jobs`): each picks its own
batch size for the GPUs it gets, so goodput is taken at the best batch.

Rules, each tested in `tests/test_policy_sia.py`:

Configurations
    Per GPU type, single-node 1, 2, 4, ... R GPUs and whole nodes 2R ... NR
    (`gpuq.policies.sia.configs`; the 64-GPU mixed cluster has 19).
Goodput matrix G
    Each job's goodput on each configuration from its model on that type,
    normalized by its smallest positive value (times its minimum GPUs), and
    every configuration but its current one multiplied by the restart
    factor (`gpuq.policies.sia.matrix`, which also states the caps: growth
    at most `max_growth` x per round, the batch limit, `max_gpus`, minimums,
    `spread` and placement constraints).
Selection
    Minimize sum G^p (p < 0; maximize for p > 0) plus lambda_n per waiting
    job (`gpuq.policies.sia.solve`, scipy's HiGHS); each job at most one
    configuration; per pool of nodes, GPUs chosen within the GPUs free of
    unpreemptible jobs, plus gpuq's rows for parts of nodes and for jobs
    confined to some nodes (`gpuq.policies.sia.problem`).
Unpreemptible jobs
    A running job the caller cannot preempt (`JobView.preemptible` False)
    keeps exactly its allocation: its GPUs leave the problem, and it is not
    a row of G (the paper's equality constraint, applied before solving).
Placement
    Unchanged configurations keep their GPUs; the rest are placed
    multi-node first, then best-fit, evicting a few smaller single-node jobs
    on fragmentation (`gpuq.policies.sia.placement`). A pair the placer
    still cannot place (shapes other than Sia's, such as a rigid 3-GPU job,
    can defeat the rows) is dropped and the ILP solved again, up to
    `REPAIRS` times; then the job keeps its current GPUs if they are free,
    else waits, with a note.

gpuq's rules (off here by default; the `gpuq` policy turns them on)
    `unknown="prior"`: a job with no model anywhere is valued by the types'
    prior speeds, up to its cap (`gpuq.policies.sia.matrix`), instead of
    Sia's one GPU of any type. `shrink="idle"`: while a GPU is held by no
    job, no running job is given fewer GPUs than it holds (a shrink costs it
    a restart, imagenet's 250 s on up to 24 GPUs on Sia's tables, to make
    room a newcomer could find idle). `service` (GPU-seconds, 0: off): each
    job's terms of the objective are weighted by max((1 + A / service)^-1/2,
    `service_floor`), A its attained service (`JobView.attained_service`):
    among the jobs a round sizes, those served least, likely the short ones
    when sizes are heavy-tailed (Tiresias's argument), win the contested
    GPUs, which lowers average JCT; the floor bounds how far the longest
    jobs are discounted (their p99). Measured on Sia's Philly and Saturn
    traces in bench/RESULTS.md, each rule alone and together.
Starts (`starts`)
    "charged" (Sia's rule, the default): a job holding no GPU has the
    restart factor on every configuration too, so one stopped after its
    first restarts may wait with GPUs idle (with p = -0.5 and lambda_n =
    1.1 a factor below about 0.83 makes a 1-GPU start cost more than
    waiting). "idle": while any GPU is held by no job, a job holding none
    is not charged (gpuq's rule for Pollux, `gpuq.policies.gpuq.policy`);
    "free": never charged.

Defaults follow the paper's experiments: p = -0.5, lambda_n = 1.1 (§4.2);
the ILP is solved to a 1e-4 relative gap within `time_limit` seconds
(each solve). The policy is deterministic (HiGHS is, short of the time
limit); `seed` is accepted for the registry and unused. Goodput tables are
memoized per model from one decision to the next, which changes speed only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuq.policies.confine import node_names
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView
from gpuq.policies.sia.columns import BoolArray, Columns, Room
from gpuq.policies.sia.configs import (
    Config,
    Pool,
    current_config,
    describe,
    pool_of_nodes,
    pools_of,
    standard_configs,
)
from gpuq.policies.sia.goodputs import FloatArray, GoodputMemo
from gpuq.policies.sia.matrix import Limits, Row, job_rows, restart_factor
from gpuq.policies.sia.placement import place
from gpuq.policies.sia.problem import Problem, build, config_of
from gpuq.policies.sia.solve import Selection, select

STARTS = ("charged", "idle", "free")
"""When starting a job that holds no GPU escapes the restart factor (module docstring)."""

UNKNOWN = ("smallest", "prior")
"""How a job with no model is valued: Sia's smallest shapes, or the types' prior."""

SHRINK = ("any", "idle")
"""When a running job may be given fewer GPUs: any round, or only with no GPU idle."""

REPAIRS = 3
"""Times the ILP is solved again without the pairs the placer could not place."""


class SiaPolicy:
    """Sia's scheduler: one ILP over (job, GPU type, count) per round (module docstring)."""

    name = "sia"
    capabilities = Capabilities(adaptive_jobs=True, preemption=True, multi_node=True)

    def __init__(
        self,
        seed: int = 0,
        p: float = -0.5,
        lambda_n: float = 1.1,
        max_growth: int = 2,
        max_gpus: int = 64,
        time_limit: float = 1.0,
        starts: str = "charged",
        unknown: str = "smallest",
        shrink: str = "any",
        service: float = 0.0,
        service_floor: float = 0.3,
    ) -> None:
        if not math.isfinite(p) or p == 0:
            raise ValueError(f"p must be finite and non-zero, got {p}")
        if not math.isfinite(lambda_n) or lambda_n < 0:
            raise ValueError(f"lambda_n must be finite and >= 0, got {lambda_n}")
        if max_growth < 1 or max_gpus < 1:
            raise ValueError("need max_growth >= 1 and max_gpus >= 1")
        if not time_limit > 0:
            raise ValueError(f"time_limit must be positive, got {time_limit}")
        if starts not in STARTS:
            raise ValueError(f"starts must be one of {', '.join(STARTS)}, not {starts!r}")
        if unknown not in UNKNOWN:
            raise ValueError(f"unknown must be one of {', '.join(UNKNOWN)}, not {unknown!r}")
        if shrink not in SHRINK:
            raise ValueError(f"shrink must be one of {', '.join(SHRINK)}, not {shrink!r}")
        if not math.isfinite(service) or service < 0:
            raise ValueError(f"service must be finite and >= 0, got {service}")
        if not 0 <= service_floor <= 1:
            raise ValueError(f"service_floor must be in [0, 1], got {service_floor}")
        self.starts = starts
        self.unknown = unknown
        self.shrink = shrink
        self.service = service
        self.service_floor = service_floor
        self.seed = seed
        self.p = p
        self.lambda_n = lambda_n
        self.max_growth = max_growth
        self.max_gpus = max_gpus
        self.time_limit = time_limit
        self._memo = GoodputMemo()
        self.last_selection: Selection | None = None
        """How the last decision's solver ended (for benchmarks and tests)."""

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Solve this round's ILP and place the chosen configurations."""
        if not state.jobs or not state.nodes:
            return Decision()
        matrix = self.matrix(state, now)
        pools, names, free = matrix.columns.pools, matrix.names, matrix.free
        rows, columns, pinned = matrix.rows, matrix.columns, matrix.pinned
        problem = build(rows, columns, names)
        jobs = {job.id: job for job in state.jobs}
        currents = {row.job.id: row.current for row in rows}
        banned = self._shrinks(matrix, problem)
        weights = self._weights(rows, problem)
        for attempt in range(REPAIRS + 1):
            selection = select(
                problem.owners,
                np.where(banned, 0.0, problem.values),
                problem.usage,
                problem.capacity,
                self.p,
                self.lambda_n,
                self.time_limit,
                fallback=problem.current & ~banned,
                weights=weights,
            )
            pairs = problem.chosen(rows, selection.chosen)
            chosen = {job_id: config_of(columns, problem, pair) for job_id, pair in pairs.items()}
            placement = place(pools, names, free, chosen, jobs, currents)
            if not placement.failed or attempt == REPAIRS:
                break
            banned[[pairs[job_id] for job_id in placement.failed]] = True
        self.last_selection = selection
        allocations = {job.id: tuple(job.allocation) for job in pinned}
        allocations.update(placement.allocations)
        notes = {job.id: f"sia: not preemptible; keeps its {job.gpus} GPUs" for job in pinned}
        for row in rows:
            note = _note(row, state, chosen, placement.failed, allocations, pools)
            if row.job.id in placement.moved:
                note += "; moved to make room for another job"
            notes[row.job.id] = note
        return Decision(allocations=allocations, notes=notes)

    def _shrinks(self, matrix: Matrix, problem: Problem) -> BoolArray:
        """The pairs `shrink` rules out: fewer GPUs for a running job while one is idle."""
        banned = np.zeros(problem.values.size, dtype=bool)
        if self.shrink == "any" or not matrix.idle:
            return banned
        sizes = np.array([config.nodes * config.gpus for config in matrix.columns.configs])
        for number, row in enumerate(matrix.rows):
            if row.current is not None and row.current_column >= 0:  # it may stay as it is
                start, end = int(problem.offsets[number]), int(problem.offsets[number + 1])
                mine = sizes[problem.columns[start:end]]
                banned[start:end] = mine < row.current.nodes * row.current.gpus
        return banned

    def _weights(self, rows: Sequence[Row], problem: Problem) -> FloatArray | None:
        """Each pair's job weight under `service` (None: off)."""
        if not self.service:
            return None
        served = np.array([row.job.attained_service for row in rows], dtype=np.float64)
        weight = np.power(1.0 + np.maximum(served, 0.0) / self.service, -0.5)
        return np.maximum(weight, self.service_floor)[problem.owners]

    def matrix(self, state: ClusterState, now: float) -> Matrix:
        """This round's G (module docstring); ValueError for an allocation of the wrong length."""
        width = len(state.nodes)
        for job in state.jobs:
            if any(job.allocation) and len(job.allocation) != width:
                raise ValueError(
                    f"job {job.id}: allocation has {len(job.allocation)} entries for {width} nodes"
                )
        pools = pools_of(state.nodes)
        owner = pool_of_nodes(pools, width)
        names = tuple(node.name for node in state.nodes)
        free = [node.gpus for node in state.nodes]
        pinned = [job for job in state.jobs if job.running and not job.preemptible]
        for job in pinned:
            for i, count in enumerate(job.allocation):
                free[i] -= count
        free = [max(count, 0) for count in free]
        room = Room(
            tuple(np.array([free[i] for i in pool.nodes], dtype=np.int64) for pool in pools)
        )
        standard = standard_configs(pools, self.max_gpus)
        token = self._memo.token((standard, tuple(pool.gpu_type for pool in pools)))
        columns = Columns(pools, standard, room, token)
        limits = Limits(self.max_growth, self.max_gpus, prior=self.unknown == "prior")
        self._memo.start_decision()
        triples = []
        held = sum(sum(job.allocation) for job in state.jobs)
        idle = held < sum(node.gpus for node in state.nodes)
        free_starts = self.starts == "free" or (self.starts == "idle" and idle)
        for job in state.jobs:
            if job.running and not job.preemptible:
                continue
            current = current_config(pools, owner, job.allocation) if job.running else None
            penalty = state.restart_penalty if job.restart_penalty is None else job.restart_penalty
            factor = restart_factor(now - job.submit_time, job.num_restarts, penalty)
            if free_starts and not job.running:
                factor = 1.0
            triples.append((job, current, factor))
        rows = job_rows(triples, columns, names, limits, self._memo)
        return Matrix(columns, rows, names, free, pinned, idle)


@dataclass(frozen=True, slots=True)
class Matrix:
    """One round's goodput matrix G and what it was built from."""

    columns: Columns
    rows: list[Row]
    names: tuple[str, ...]
    free: list[int]
    """GPUs of each node free of unpreemptible jobs."""
    pinned: list[JobView]
    """Running jobs that cannot be preempted: they keep their GPUs, outside G."""
    idle: bool
    """Whether some GPU is held by no job this round (`starts`, `shrink`)."""

    def row(self, job_id: int) -> dict[Config, float]:
        """Job `job_id`'s row: its configurations and their values (after the restart factor)."""
        row = next(row for row in self.rows if row.job.id == job_id)
        return {
            self.columns.configs[int(c)]: float(v)
            for c, v in zip(row.columns, row.values, strict=True)
        }


def _note(
    row: Row,
    state: ClusterState,
    chosen: dict[int, Config],
    failed: dict[int, str],
    allocations: dict[int, tuple[int, ...]],
    pools: Sequence[Pool],
) -> str:
    """Why the job runs as it does, or waits."""
    job = row.job
    config = chosen.get(job.id)
    if config is not None and job.id in failed:
        shape = describe(config, pools)
        if job.id in allocations:
            return f"sia: {shape} did not fit ({failed[job.id]})"
        return f"waiting: sia chose {shape}, but {failed[job.id]}"
    if config is not None:
        return f"sia: {describe(config, pools)}"
    least = max(job.min_gpus, 1)
    if not row.columns.size:
        mine = sum(node.gpus for node in state.nodes if job.may_run_on(node.name))
        if least > mine and job.nodes is not None:
            where = node_names(job.nodes)
            have = "has" if len(job.nodes) == 1 else "have"
            return f"waiting: needs {least} GPUs; {where} {have} {mine}"
        if least > mine:
            return f"waiting: needs {least} GPUs; the cluster has {mine}"
        return f"waiting: no configuration of {least} GPUs or more has room"
    return "waiting: sia gave the GPUs to jobs that gain more from them"


__all__ = ["Matrix", "SiaPolicy"]
