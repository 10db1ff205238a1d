"""ONES: online evolutionary batch-size orchestration (Bian et al., SC'21): the `ones` policy.

ONES chooses each job's GPUs *and* total batch size. It keeps a population of
candidate schedules (GPU-indexed genomes, `genome`), evolves them on every
call with refresh, uniform crossover, uniform mutation and reorder
(`operators`), scores them by SRUF, the total remaining GPU-time
(`fitness`), and deploys the best, changing a running job only after it
has finished an epoch (deployment gating). Batch sizes grow under a per-job limit
(`limits`). Jobs are not adaptive (`capabilities.adaptive_jobs` False): the caller
runs each job with the total batch in `Decision.batch_sizes`; scaling the
learning rate linearly with it is the job's business, not the policy's.
ONES is elastic, so `gpus_requested` is ignored; a job's GPUs are bounded by
`max_gpus` and by its batch limit and per-GPU bounds.

Choices gpuq makes where the paper leaves them open (the paper's constants
were lost with its formulas; see also the other modules' docstrings):

Population and search
    `population` candidates (default: one per GPU, as the paper suggests),
    seeded with the live schedule plus random ones ("a random job on each
    GPU", then refreshed). Each call refreshes every candidate, adds the live
    schedule, and runs `generations` rounds (default 2: the population
    persists between calls, so the search continues across ticks). A round
    makes population/2 crossover pairs (each parent used once, in random
    order) and mutates `mutants` random candidates (default population/2) with
    rate `mutation_rate` (default 0.1), then selects from parents and
    children together. Selection: draw every job's progress once, score all
    candidates with that draw, and keep the `top_k` best not yet kept,
    repeating with fresh draws until `population` are kept (`top_k`
    default: the population size, i.e. one sampled ranking). The deployed
    candidate is Alg. 1's pick: one more draw, smallest score wins.
Deployment gating
    With `gating="global"` (the default, the paper's rule) the running
    jobs' allocations and batches change only when every job that runs now
    has completed an epoch since the last change (first call: at once).
    Until then they are pinned: every candidate keeps them where they are
    (`ones_operators.pin`), so the search still chooses which waiting jobs
    get the idle GPUs, and that is deployed (`fill_between_updates`, default
    on; off, idle GPUs wait for the next change as in the paper). A job
    started that way must also finish an epoch before the next change.
    With `gating="job"`, each running job is pinned only until it has
    completed an epoch since its own last change; the paper's reason ("each
    job can finish one epoch so as to completely scan its training dataset")
    holds per job, and one job with long epochs no longer freezes the whole
    cluster. `max_hold` seconds (default None: never) lifts a hold that
    lasts that long.
Batch-size limits
    Start, Scale-up, Resume and Scale-down as in `limits`, with
    `warmup_seconds` (default 60) and `penalty_intervals` (default 1, the
    paper's "longer than the average arrival interval"). The arrival rate is
    `arrival_rate` if given, else the number of distinct jobs seen divided by
    the time since the first of them was submitted. The penalty applies only
    while some job waits: with nobody queued there is no convoy to break up.
    A rejection (halving) is counted once per change of the schedule that
    leaves a waiting job waiting.
Placement constraints
    The search ignores them (`JobView.nodes`): a job the deployed schedule
    puts on a node it may not use is moved to its own nodes, or waits
    (`gpuq.policies.confine`).
Not implemented
    The GPR progress predictor (an oracle with Beta noise stands in, see
    `fitness`) and ONES's in-place NCCL rescaling (a runner feature).

Performance: the fitness is vectorized over the whole pool, the operators
work on small per-candidate count matrices, and what follows from a
candidate and the decision's context alone (genes, and refreshed or crossed
candidates whose fill drew no random number) is memoized per decision
(`Context.memo`), which changes speed only. The cost grows with population
x generations; both are constructor arguments.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from gpuq.policies.confine import confine
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView
from gpuq.policies.ones.fitness import (
    FloatArray,
    Progress,
    census,
    throughput_table,
    utilization,
)
from gpuq.policies.ones.genome import (
    Assignment,
    Candidate,
    Genome,
    IntArray,
    Layout,
    candidate,
    encode,
    gene_rows,
    rule_batches,
    to_counts,
)
from gpuq.policies.ones.limits import (
    BatchBounds,
    LimitState,
    effective_limit,
    job_rules,
    observe,
    ran,
    reject,
    start,
    warming_up,
)
from gpuq.policies.ones.operators import Context, crossover, mutate, refresh


class OnesPolicy:
    """The ONES scheduler; keeps its population and per-job limits between calls."""

    name = "ones"
    capabilities = Capabilities(preemption=True, remaining_work=True, remembers=True)

    def __init__(
        self,
        seed: int = 0,
        population: int | None = None,
        mutation_rate: float = 0.1,
        top_k: int | None = None,
        *,
        generations: int = 2,
        mutants: int | None = None,
        concentration: float = 20.0,
        warmup_seconds: float = 60.0,
        penalty_intervals: float = 1.0,
        arrival_rate: float | None = None,
        restart_cost: bool = True,
        gating: str = "global",
        fill_between_updates: bool = True,
        max_hold: float | None = None,
    ) -> None:
        if population is not None and population < 2:
            raise ValueError("population must be at least 2")
        if not 0.0 <= mutation_rate <= 1.0:
            raise ValueError("mutation_rate must be in [0, 1]")
        if gating not in ("global", "job"):
            raise ValueError("gating must be 'global' or 'job'")
        self.population = population
        self.mutation_rate = mutation_rate
        self.top_k = top_k
        self.generations = generations
        self.mutants = mutants
        self.concentration = concentration
        self.warmup_seconds = warmup_seconds
        self.penalty_intervals = penalty_intervals
        self.arrival_rate = arrival_rate
        self.restart_cost = restart_cost
        self.gating = gating
        self.fill_between_updates = fill_between_updates
        self.max_hold = max_hold
        self._rng = np.random.default_rng(seed)
        self._layout: Layout | None = None
        self._members: list[Genome | Candidate] = []
        self._pool: list[IntArray] = []
        self._limits: dict[int, LimitState] = {}
        self._total_work: dict[int, float] = {}
        self._gate: dict[int, int] = {}
        self._last_change: float | None = None
        self._changed: dict[int, tuple[int, float]] = {}
        self._seen = 0
        self._first_submit = math.inf
        self._known: set[int] = set()
        self._throughput: dict[Hashable, FloatArray] = {}

    def limit_state(self, job_id: int) -> LimitState | None:
        """The batch-size limit state of a job, for inspection and tests."""
        return self._limits.get(job_id)

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Evolve the population and return the live or newly deployed schedule."""
        layout = self._layout_of(state)
        jobs = sorted(state.jobs, key=lambda job: job.id)
        if layout.gpus == 0 or not jobs:
            return Decision()
        ctx = self._context(jobs, layout, now)
        running = {
            job.id: Assignment(job.allocation, self._batch_of(job)) for job in jobs if job.running
        }
        live = encode(running, layout, strict=False)
        live_counts, live_batch = to_counts(live, ctx.rules, layout)
        pinned = self._pinned(jobs, now)
        ctx = replace(ctx, pinned=pinned, live=live_counts)
        penalty = state.restart_penalty if self.restart_cost else 0.0
        self._evolve(ctx, live, live_counts, penalty)
        if pinned.any() and self.gating == "global" and not self.fill_between_updates:
            target = live_counts.copy()
        else:
            target = self._best(ctx, live_counts, penalty)
        batch = np.where(pinned, live_batch, rule_batches(target, ctx.rules))
        before = self._schedule(jobs, live_counts, live_batch)
        after = self._schedule(jobs, target, batch)
        return confine(state, self._deploy(jobs, before, after, pinned, now))

    # The steps of a decision -------------------------------------------------

    def _layout_of(self, state: ClusterState) -> Layout:
        """The GPU layout, resetting the population when the cluster changed."""
        shape = tuple(node.gpus for node in state.nodes)
        if self._layout is None or self._layout.node_gpus != shape:
            self._layout = Layout(shape)
            self._members = []
        return self._layout

    def _batch_of(self, job: JobView) -> int:
        """The total batch a running job runs with: as deployed, else its own."""
        limits = self._limits.get(job.id)
        return (limits.batch if limits else 0) or job.batch_size or job.init_batch_size or 1

    def _context(self, jobs: list[JobView], layout: Layout, now: float) -> Context:
        """Update limits and work estimates from `jobs` and gather the operators' inputs."""
        for job in jobs:
            if job.id not in self._known:
                self._known.add(job.id)
                self._seen += 1
                self._first_submit = min(self._first_submit, job.submit_time)
        rate = self.arrival_rate
        if rate is None and self._seen >= 2 and now > self._first_submit:
            rate = self._seen / (now - self._first_submit)
        if all(job.running for job in jobs):
            rate = None  # nobody waits: no convoy to prevent, no penalty
        bounds = [BatchBounds.of(job) for job in jobs]
        limits: dict[int, LimitState] = {}
        for job, bound in zip(jobs, bounds, strict=True):
            old = self._limits.get(job.id)
            limits[job.id] = start(job, bound) if old is None else observe(old, job, bound)
        self._limits = limits
        bounds = [
            warming_up(bound, limits[job.id], job.run_time, self.warmup_seconds)
            for job, bound in zip(jobs, bounds, strict=True)
        ]
        effective = [
            effective_limit(limits[job.id], job.run_time, rate, self.penalty_intervals)
            for job in jobs
        ]
        rules = job_rules([job.id for job in jobs], bounds, effective, layout.gpus)
        remaining: list[float | None] = []
        for job in jobs:
            if job.remaining_iterations is None:
                remaining.append(None)
                continue
            work = job.remaining_iterations * (job.batch_size or job.init_batch_size or 1)
            self._total_work[job.id] = max(self._total_work.get(job.id, 0.0), work)
            remaining.append(work)
        self._total_work = {job.id: self._total_work.get(job.id, 0.0) for job in jobs}
        progress = Progress.of(
            remaining, [self._total_work[job.id] for job in jobs], self.concentration
        )
        arrival = np.array(
            sorted(range(len(jobs)), key=lambda row: (jobs[row].submit_time, jobs[row].id)),
            dtype=np.int64,
        )
        never_ran = np.array(
            [limits[job.id].batch == 0 and not job.running for job in jobs], dtype=np.bool_
        )
        return Context(
            rules,
            layout,
            throughput_table(jobs, rules, layout, self._throughput),
            progress,
            np.asarray(effective, dtype=np.int64),
            never_ran,
            arrival,
            self._rng,
            np.asarray(layout.node_gpus, dtype=np.int64),
            np.zeros(len(jobs), dtype=np.bool_),
            np.zeros((len(jobs), layout.nodes), dtype=np.int64),
        )

    def _evolve(self, ctx: Context, live: Genome, live_counts: IntArray, penalty: float) -> None:
        """Refresh the population and run `generations` rounds of evolution."""
        size = self.population or max(2, ctx.layout.gpus)
        members = list(self._members)
        while len(members) < size:
            members.append(self._random_genome(ctx))
        members.append(live)
        pool = [refresh(member, ctx) for member in members]
        for _ in range(self.generations):
            parents = [self._genes(counts, ctx) for counts in pool]
            order = ctx.rng.permutation(len(pool)).tolist()
            children: list[IntArray] = []
            for a, b in zip(order[0::2], order[1::2], strict=False):
                children.extend(crossover(parents[a], parents[b], ctx))
            chosen = ctx.rng.choice(len(pool), size=self.mutants or size // 2)
            children.extend(mutate(pool[i], ctx, self.mutation_rate) for i in chosen.tolist())
            pool = self._select(pool + children, ctx, live_counts, penalty, size)
        self._pool = pool
        self._members = [candidate(counts, ctx.rules) for counts in pool]

    @staticmethod
    def _genes(counts: IntArray, ctx: Context) -> IntArray:
        """The candidate's genes as job rows (`gene_rows`), memoized in `ctx` by content."""
        key = b"n" + counts.tobytes()
        genes = ctx.memo.get(key)
        if genes is None:
            genes = ctx.memo[key] = gene_rows(counts, ctx.layout)
        return genes

    def _random_genome(self, ctx: Context) -> Genome:
        """A random schedule: a random job on each GPU (the paper's start), repaired later."""
        return Genome(
            ctx.rng.choice(ctx.rules.ids, size=ctx.layout.gpus).astype(np.int64),
            np.ones(ctx.layout.gpus, dtype=np.int64),
        )

    def _select(
        self, pool: list[IntArray], ctx: Context, live_counts: IntArray, penalty: float, size: int
    ) -> list[IntArray]:
        """Keep `size` candidates: repeated sampled rankings, `top_k` best each time."""
        counted = census(np.stack(pool), live_counts)
        step = max(1, self.top_k or size)
        kept: list[int] = []
        taken = np.zeros(len(pool), dtype=np.bool_)
        while len(kept) < min(size, len(pool)):
            work = ctx.progress.sample(ctx.rng)
            scores = np.where(taken, np.inf, utilization(counted, ctx.table, work, penalty))
            best = np.argsort(scores, kind="stable")[: min(step, size - len(kept))]
            kept.extend(best.tolist())
            taken[best] = True
        return [pool[i] for i in kept]

    def _best(self, ctx: Context, live_counts: IntArray, penalty: float) -> IntArray:
        """Alg. 1: draw every job's progress once; the candidate scoring least wins."""
        counted = census(np.stack(self._pool), live_counts)
        work = ctx.progress.sample(ctx.rng)
        scores = utilization(counted, ctx.table, work, penalty)
        return self._pool[int(np.argmin(scores))].copy()

    def _pinned(self, jobs: list[JobView], now: float) -> NDArray[np.bool_]:
        """Running jobs that may not change yet (deployment gating)."""
        running = np.array([job.running for job in jobs], dtype=np.bool_)
        if self.gating == "global":
            return running if not self._gate_open(jobs, now) else np.zeros_like(running)
        pinned = np.zeros_like(running)
        for row, job in enumerate(jobs):
            if job.running and job.id in self._changed:
                epoch, when = self._changed[job.id]
                waited = self.max_hold is not None and now - when >= self.max_hold
                pinned[row] = job.epoch < epoch + 1 and not waited
        return pinned

    def _gate_open(self, jobs: list[JobView], now: float) -> bool:
        """True if every running job finished an epoch since the last change."""
        if self._last_change is None:
            return True
        if self.max_hold is not None and now - self._last_change >= self.max_hold:
            return True
        for job in jobs:
            if job.running and job.id not in self._gate:
                self._gate[job.id] = job.epoch
        return all(job.epoch >= self._gate[job.id] + 1 for job in jobs if job.running)

    @staticmethod
    def _schedule(jobs: list[JobView], counts: IntArray, batch: IntArray) -> dict[int, Assignment]:
        """The jobs that hold GPUs in `counts`, with node vectors and batches."""
        return {
            job.id: Assignment(tuple(int(c) for c in counts[row]), int(batch[row]))
            for row, job in enumerate(jobs)
            if counts[row].any()
        }

    def _deploy(
        self,
        jobs: list[JobView],
        before: dict[int, Assignment],
        after: dict[int, Assignment],
        pinned: NDArray[np.bool_],
        now: float,
    ) -> Decision:
        """Update limits and gating records for what changes, and build the Decision."""
        held = bool(pinned.any())
        changed = before != after
        for job in jobs:
            if changed and job.id not in after and job.id not in before:
                self._limits[job.id] = reject(self._limits[job.id])
            if job.id not in after:
                self._changed.pop(job.id, None)
                continue
            self._limits[job.id] = ran(self._limits[job.id], after[job.id].batch)
            if before.get(job.id) != after[job.id]:
                self._changed[job.id] = (job.epoch, now)
                if held:
                    self._gate[job.id] = job.epoch
        if changed and not held and self.gating == "global":
            self._last_change = now
            self._gate = {job.id: job.epoch for job in jobs if job.id in after}
        return Decision(
            allocations={job_id: a.allocation for job_id, a in after.items()},
            batch_sizes={job_id: a.batch for job_id, a in after.items()},
            notes=self._notes(jobs, after, pinned),
        )

    def _notes(
        self, jobs: list[JobView], after: Mapping[int, Assignment], pinned: NDArray[np.bool_]
    ) -> dict[int, str]:
        """A short reason per job for `gpuq show`."""
        wait = "every running job finishes" if self.gating == "global" else "it finishes"
        notes: dict[int, str] = {}
        for row, job in enumerate(jobs):
            limit = self._limits[job.id].limit
            if job.id in after:
                gpus, batch = sum(after[job.id].allocation), after[job.id].batch
                notes[job.id] = f"ones: {gpus} GPUs, batch {batch} (limit {limit})"
                if pinned[row]:
                    notes[job.id] += f"; held until {wait} an epoch"
            else:
                notes[job.id] = f"ones: waiting (batch limit {limit})"
        return notes


__all__ = ["OnesPolicy"]
