"""AFS (Apathetic Future Share, Hwang et al., NSDI'21): elastic GPU shares at churn events.

`AfsPolicy(variant="L")` (name `afs`) is AFS-L, which knows each job's
remaining work; `AfsPolicy(variant="P")` (name `afs-p`, also built by
`AfsPPolicy()`) is AFS-P, which does not. The algorithms on throughput
tables are in `gpuq.policies.afs.core`, network packing and placement in
`gpuq.policies.afs.packing`; this module builds their inputs from a
`ClusterState` and keeps AFS-P's state. The notes are optimus_afs.md
B.3-B.5 and C.2. Choices, each tested in tests/test_policy_afs_policy.py:

Throughput tables
    AFS assumes a fixed global batch (`capabilities.adaptive_jobs` False: jobs keep
    `batch_size`). `thr_j(r)` is iterations per second on `r` GPUs, the
    inverse of the step time at that batch predicted by the job's fitted
    model, on `ceil(r / G)` nodes with G the largest node's GPUs, with the
    per-GPU batch `ceil(B / r)` and gradient accumulation when that exceeds
    `local_bsz_bounds[1]` (the formula of
    `gpuq.policies.baselines.fixed_batch_step_time`, vectorized). `r` runs
    up to the cluster's GPUs, `max_gpus` and `B // local_bsz_bounds[0]`.
    The fitted model, which the agent refits from what it measured, stands
    in for CoDDL's measure-and-extrapolate: a job's new or changed model
    re-runs the allocator (the paper's "re-adjust"), but no linear
    extrapolation is layered on it, since a wrong overestimate costs a
    checkpoint-restart in gpuq rather than CoDDL's 4 ms. A job with no model
    (or no batch size) is "overestimated first": linear scaling from
    `unknown_step_time` seconds per step, capped at its fair share
    `max(1, M // n)`.

Lengths (AFS-L)
    `len(r) = remaining_iterations / thr(r)`; an unknown remaining count is
    an infinite length (the job is longer than every job with known work).

Events
    As in the paper, shares change only at churn events: a job arrives or
    leaves, the nodes change, a job's step-time model (`goodput.perf`, refit
    from new measurements), batch size or bounds change, or an AFS-P job's
    time unit runs out. Gradient statistics are no event: at a fixed batch
    they do not change throughput. Between events `decide`
    returns its previous decision unchanged.

AFS-P processor sharing
    A job's counter is `floor(executed / unit)`, where executed is the time
    it has held GPUs: its `run_time` when the policy first sees it, plus the
    time between consecutive `decide` calls in which the state shows it
    running. With more jobs than GPUs, a job granted a GPU starts a slot and
    keeps the GPU until it has executed one more `unit` (checked at each
    call, so a unit that is a multiple of the tick is exact), whatever
    arrives meanwhile; freed GPUs go to the lowest counters, ties by submit
    time then id; an evicted job with the lowest counter may run again at
    once. With no more jobs than GPUs the counters are ignored and slots are
    dropped. Time going backwards (a new run) resets this state.

Unit time
    The paper uses 2 h on the full Philly traces and says to scale it with
    the workload. Its moderately loaded trace in Fig. 2 has average JCTs of
    15-31 h under the four policies compared there; the Pollux
    workloads that gpuq's simulator replays have 0.6-1.9 h (2089-6914 s
    published), 8-16x shorter, so the default is 2 h / 8 = 900 s: 15 ticks
    of 60 s, and 30x the 30 s restart charged per eviction (at most 3.3%
    overhead). Pass `unit` for other workloads.

Placement
    Shares are regulated to CoDDL's network packing when every node has the
    same power-of-two GPU count and placed to keep unchanged jobs where they
    are (`gpuq.policies.afs.packing`). Deviation: on nodes of other or mixed
    sizes shares are not regulated, a job may span partly used nodes, and
    the paper's "at most one multi-node job per node" is not guaranteed.
    Shares ignore placement constraints (`JobView.nodes`): a job placed on
    a node it may not use is moved to its own nodes, or waits
    (`gpuq.policies.confine`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from gpuq.errors import UsageError
from gpuq.policies.afs.core import AfsJob, Shares, afs_l, afs_p, peak_gpus, processor_sharing
from gpuq.policies.afs.packing import packing_size, place, regulate
from gpuq.policies.confine import confine
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView

DEFAULT_UNIT = 900.0
"""AFS-P's time unit in seconds: the paper's 2 h scaled to the Pollux workloads."""

_SLACK = 1e-6  # seconds of float drift tolerated when a unit runs out
_MIN_STEP = 1e-9  # seconds: a degenerate model (all parameters 0) still gives finite throughput


def fixed_batch_throughputs(job: JobView, max_replicas: int, per_node: int) -> list[float]:
    """Iterations per second of `job` at its own batch on 1..`max_replicas` GPUs.

    Requires `job.goodput` and `job.batch_size > 0`; the same step time as
    `gpuq.policies.baselines.fixed_batch_step_time`, for all counts at once.
    """
    if job.goodput is None or job.batch_size <= 0 or max_replicas < 1:
        return []
    replicas = np.arange(1, max_replicas + 1)
    nodes = np.ceil(replicas / max(per_node, 1))
    local = np.ceil(job.batch_size / replicas)
    accum = np.ceil(local / max(job.local_bsz_bounds[1], 1)) - 1
    micro = np.ceil(local / (accum + 1))
    max_batch = job.max_batch_size if job.max_batch_size > 0 else job.batch_size
    micro = np.maximum(1, np.minimum(micro, max_batch // (replicas * (accum + 1))))
    steps = np.asarray(job.goodput.step_time(nodes, replicas, micro, accum), dtype=np.float64)
    return [float(value) for value in 1.0 / np.maximum(steps, _MIN_STEP)]


class AfsPolicy:
    """AFS-L or AFS-P shares at churn events, packed onto nodes (module docstring)."""

    name: str = "afs"
    capabilities = Capabilities(preemption=True, remaining_work=True, remembers=True)

    def __init__(
        self,
        variant: Literal["L", "P"] = "L",
        *,
        unit: float = DEFAULT_UNIT,
        seed: int = 0,
        cap_at_peak: bool = True,
        unknown_step_time: float = 1.0,
    ) -> None:
        if variant not in ("L", "P"):
            raise UsageError(f"unknown AFS variant {variant!r}; known: L, P")
        if not unit > 0:
            raise UsageError(f"AFS-P unit time must be positive, got {unit}")
        if not unknown_step_time > 0:
            raise UsageError(f"unknown_step_time must be positive, got {unknown_step_time}")
        self.variant = variant
        self.name = "afs" if variant == "L" else "afs-p"
        self.capabilities = Capabilities(
            preemption=True, remaining_work=variant == "L", remembers=True
        )
        self.unit = unit
        self.seed = seed
        self.cap_at_peak = cap_at_peak
        self.unknown_step_time = unknown_step_time
        self._reset()

    def _reset(self) -> None:
        self._clock: float | None = None
        self._executed: dict[int, float] = {}
        self._slot_start: dict[int, float] = {}
        self._signature: object = None
        self._last: Decision | None = None

    # -- inputs --------------------------------------------------------------

    def throughput_table(self, job: JobView, state: ClusterState) -> tuple[float, ...]:
        """`thr[0..K]` for `job` (module docstring); `(0.0,)` when it can use no GPU."""
        total = state.total_gpus
        per_node = max((node.gpus for node in state.nodes), default=1) or 1
        limit = min(total, job.max_gpus)
        if job.goodput is None or job.batch_size <= 0:
            fair = max(1, total // max(len(state.jobs), 1))
            count = min(limit, fair)
            return (0.0, *(r / self.unknown_step_time for r in range(1, count + 1)))
        limit = min(limit, job.batch_size // max(job.local_bsz_bounds[0], 1))
        return (0.0, *fixed_batch_throughputs(job, limit, per_node))

    def executed(self, job_id: int) -> float:
        """Seconds job `job_id` has held GPUs, as far as this policy has seen."""
        return self._executed.get(job_id, 0.0)

    def counter(self, job_id: int) -> int:
        """AFS-P's counter: whole time units job `job_id` has executed."""
        return math.floor((self.executed(job_id) + _SLACK) / self.unit)

    def _observe(self, state: ClusterState, now: float) -> None:
        if self._clock is not None and now < self._clock:
            self._reset()
        elapsed = 0.0 if self._clock is None else now - self._clock
        present = {job.id for job in state.jobs}
        for key in [key for key in self._executed if key not in present]:
            del self._executed[key]
            self._slot_start.pop(key, None)
        for job in state.jobs:
            if job.id not in self._executed:
                self._executed[job.id] = max(job.run_time, 0.0)
            elif job.running:
                self._executed[job.id] += elapsed
        self._clock = now

    def _slot_over(self, key: int) -> bool:
        return self._executed[key] - self._slot_start[key] >= self.unit - _SLACK

    # -- decide --------------------------------------------------------------

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Recompute shares at churn events; otherwise repeat the last decision."""
        self._observe(state, now)
        signature = (
            state.nodes,
            tuple(
                (j.id, j.goodput.perf if j.goodput else None, j.batch_size, j.max_batch_size)
                + (j.local_bsz_bounds, j.max_gpus)
                + ((j.remaining_iterations is None,) if self.variant == "L" else ())
                for j in state.jobs
            ),
        )
        evict = any(self._slot_over(key) for key in self._slot_start)
        if self._last is not None and signature == self._signature and not evict:
            return confine(state, self._last)
        self._signature = signature
        self._last = self._recompute(state)
        return confine(state, self._last)

    def _recompute(self, state: ClusterState) -> Decision:
        total = state.total_gpus
        tables = {job.id: self.throughput_table(job, state) for job in state.jobs}
        jobs = [job for job in state.jobs if len(tables[job.id]) >= 2]
        notes: dict[int, str] = {
            job.id: "waiting: cannot use any GPU" for job in state.jobs if len(tables[job.id]) < 2
        }
        if self.variant == "L":
            shares = self._afs_l(jobs, tables, total, notes)
        elif len(jobs) > total:
            shares = self._sharing(jobs, total, notes)
        else:
            self._slot_start.clear()
            afs_jobs = [AfsJob(job.id, tables[job.id]) for job in jobs]
            shares = afs_p(afs_jobs, total, seed=self.seed, cap_at_peak=self.cap_at_peak)
            for job in jobs:
                notes[job.id] = f"afs-p: {shares.counts[job.id]} GPUs"
        return self._placed(state, jobs, tables, shares, notes)

    def _afs_l(
        self,
        jobs: Sequence[JobView],
        tables: dict[int, tuple[float, ...]],
        total: int,
        notes: dict[int, str],
    ) -> Shares:
        afs_jobs = [
            AfsJob(
                job.id,
                tables[job.id],
                math.inf if job.remaining_iterations is None else max(job.remaining_iterations, 0),
            )
            for job in jobs
        ]
        shares = afs_l(afs_jobs, total, cap_at_peak=self.cap_at_peak)
        for job in jobs:
            count = shares.counts[job.id]
            notes[job.id] = f"afs-l: {count} GPUs" if count else "waiting: shorter jobs run first"
        return shares

    def _sharing(self, jobs: Sequence[JobView], total: int, notes: dict[int, str]) -> Shares:
        fifo = sorted(jobs, key=lambda job: (job.submit_time, job.id))
        holding = {key for key in self._slot_start if not self._slot_over(key)}
        queue = [(job.id, self.counter(job.id)) for job in fifo]
        running = processor_sharing(queue, holding, total)
        for key in running:
            if key not in holding:
                self._slot_start[key] = self._executed[key]
        for key in [key for key in self._slot_start if key not in running]:
            del self._slot_start[key]
        for job in jobs:
            if job.id in running:
                until = self._slot_start[job.id] + self.unit
                notes[job.id] = f"afs-p sharing: 1 GPU until {until:.0f} s executed"
            else:
                notes[job.id] = f"afs-p sharing: waiting, counter {self.counter(job.id)}"
        counts = {job.id: int(job.id in running) for job in jobs}
        return Shares(counts, running)

    def _placed(
        self,
        state: ClusterState,
        jobs: Sequence[JobView],
        tables: dict[int, tuple[float, ...]],
        shares: Shares,
        notes: dict[int, str],
    ) -> Decision:
        capacity = [node.gpus for node in state.nodes]
        order = list(dict.fromkeys(shares.order))
        counts = dict(shares.counts)
        size = packing_size(capacity)
        if size is not None:
            caps = {
                job.id: peak_gpus(tables[job.id]) if self.cap_at_peak else len(tables[job.id]) - 1
                for job in jobs
            }
            counts = regulate(counts, size, caps, order)
        current = {job.id: job.allocation for job in jobs}
        allocations = place(counts, capacity, current, order)
        for key, allocation in allocations.items():
            if sum(allocation) != shares.counts[key]:
                notes[key] += f" (packed to {sum(allocation)})"
        return Decision(allocations=allocations, notes=notes)


class AfsPPolicy(AfsPolicy):
    """AFS-P under its own name, `afs-p`, for registries that build policies by class."""

    name: str = "afs-p"

    def __init__(
        self,
        *,
        unit: float = DEFAULT_UNIT,
        seed: int = 0,
        cap_at_peak: bool = True,
        unknown_step_time: float = 1.0,
    ) -> None:
        super().__init__(
            "P",
            unit=unit,
            seed=seed,
            cap_at_peak=cap_at_peak,
            unknown_step_time=unknown_step_time,
        )
