"""ONES's dynamic batch-size limit, as a small state machine (paper section 3.3.2).

ONES never lets a job's total batch size B exceed a per-job limit, so that the
batch grows gradually and linear learning-rate scaling keeps its promise. The
paper names four rules and loses the formulas; gpuq's reading of each, tested
as a table in `tests/test_policy_ones.py`:

Start
    On arrival the limit is one GPU's worth of the job's batch: the user's
    batch (`batch_size`, else `init_batch_size`) capped at the per-GPU maximum
    and at `max_batch_size`, never below `init_batch_size`. This is also the
    floor: no rule takes the limit lower. Until the job has run for
    `warmup_seconds` (the paper's "a few warm-up steps"; one 60 s tick is
    many steps for every task in the traces) it also runs on the fewest GPUs
    that hold that batch, normally one (`warming_up`).
Scale-up
    Every epoch a running job completes doubles the batch it ran with:
    `limit = min(max_batch, batch * 2**k)` for k such epochs. The base is the
    batch it actually ran with, not the old limit, so a deployed batch is
    never more than twice the previous one per completed epoch (the gradual
    growth the paper's Fig. 14 asks for), however long the job waited for
    GPUs.
Resume
    When a running job is preempted its limit becomes the batch it ran with
    (it may ask for no more than it had). Each time a new schedule is deployed
    that still leaves it waiting (a rejection) the limit halves, down to the
    floor, so that it needs fewer GPUs to come back.
Scale-down
    A job that has run for a long time is penalized to avoid the convoy
    effect. The paper's formula is lost; gpuq's is a penalty on the limit,
    `effective = max(floor, limit * min(1, c / t))`, with t the job's run time
    and `c = penalty_intervals / arrival_rate`: a job is penalized once it has
    run longer than `penalty_intervals` mean inter-arrival gaps (the paper's
    suggestion is one gap), inversely to its run time. Without an arrival rate
    there is no penalty.

Everything here is a pure function of its arguments; the policy keeps one
`LimitState` per job id between calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpuq.policies.interface import JobView
from gpuq.policies.ones.genome import IntArray, JobRules


@dataclass(frozen=True, slots=True)
class BatchBounds:
    """What batches a job can run with: totals, per-GPU bounds and GPU cap.

    A job without `max_batch_size` is not elastic in its batch: it runs with
    exactly its `batch_size` (`min_total == max_total`) on any GPU count whose
    per-GPU share fits the per-GPU bounds.
    """

    min_total: int
    max_total: int
    local_min: int
    local_max: int
    max_gpus: int

    @classmethod
    def of(cls, job: JobView) -> BatchBounds:
        """The bounds of `job`, filling unknown fields with safe values."""
        local_min = max(1, job.local_bsz_bounds[0])
        local_max = max(local_min, job.local_bsz_bounds[1])
        preferred = job.batch_size or job.init_batch_size or local_min
        init = job.init_batch_size or preferred
        if job.max_batch_size > 0:
            low, high = init, max(init, job.max_batch_size)
        else:
            low = high = max(init, preferred)
        return cls(low, high, local_min, local_max, max(1, job.max_gpus))

    def start_batch(self, preferred: int) -> int:
        """One GPU's worth of `preferred`, within the totals."""
        return max(self.min_total, min(preferred, self.local_max, self.max_total))

    def batch_for(self, gpus: int, limit: int) -> int:
        """The total batch ONES runs on `gpus` GPUs under `limit`; 0 if it cannot.

        ONES assumes a sample is worth the same at any batch size (linear
        scaling), so the largest batch the limit and the GPUs allow is the
        fastest: B = min(limit, max_total, gpus * local_max), provided it is at
        least `min_total` and at least `local_min` per GPU.
        """
        if gpus < 1 or gpus > self.max_gpus:
            return 0
        batch = min(limit, self.max_total, gpus * self.local_max)
        if batch < self.min_total or batch < gpus * self.local_min:
            return 0
        return batch


@dataclass(frozen=True, slots=True)
class LimitState:
    """One job's limit and what the limit rules need to remember about it."""

    limit: int
    floor: int
    epoch: int
    batch: int = 0
    running: bool = False


def start(job: JobView, bounds: BatchBounds) -> LimitState:
    """The state of a job ONES sees for the first time (the Start rule)."""
    first = bounds.start_batch(job.batch_size or job.init_batch_size or bounds.min_total)
    running = job.running
    batch = first if not running else max(bounds.min_total, min(job.batch_size, bounds.max_total))
    return LimitState(first, first, job.epoch, batch if running else 0, running)


def observe(state: LimitState, job: JobView, bounds: BatchBounds) -> LimitState:
    """Apply Scale-up and the preemption half of Resume to a new look at `job`.

    `state.batch` is the batch the job last ran with; `job.running` says
    whether it holds GPUs now and `job.epoch` how many epochs it has completed.
    """
    limit = state.limit
    if state.running and state.batch:
        doublings = max(0, job.epoch - state.epoch)
        if doublings:
            limit = min(bounds.max_total, state.batch << min(doublings, 62))
            limit = max(state.floor, limit)
        if not job.running:
            limit = max(state.floor, min(limit, state.batch))
    return replace(state, limit=limit, epoch=max(state.epoch, job.epoch), running=job.running)


def warming_up(
    bounds: BatchBounds, state: LimitState, run_time: float, warmup_seconds: float
) -> BatchBounds:
    """`bounds` capped, during warm-up, at the fewest GPUs that hold the start batch."""
    if run_time >= warmup_seconds:
        return bounds
    fewest = max(1, -(-state.floor // bounds.local_max))
    return replace(bounds, max_gpus=min(bounds.max_gpus, fewest))


def reject(state: LimitState) -> LimitState:
    """A deployed schedule left the job waiting: halve its limit (Resume)."""
    return replace(state, limit=max(state.floor, state.limit // 2))


def ran(state: LimitState, batch: int) -> LimitState:
    """The job was deployed with total batch `batch` (0: left waiting)."""
    if batch <= 0:
        return state
    return replace(state, batch=batch, running=True)


def effective_limit(
    state: LimitState,
    run_time: float,
    arrival_rate: float | None,
    penalty_intervals: float,
) -> int:
    """The limit after the Scale-down penalty for `run_time` seconds of execution."""
    if not arrival_rate or arrival_rate <= 0 or penalty_intervals <= 0 or run_time <= 0:
        return state.limit
    grace = penalty_intervals / arrival_rate
    if run_time <= grace:
        return state.limit
    return max(state.floor, math.floor(state.limit * grace / run_time))


def job_rules(
    ids: Sequence[int], bounds: Sequence[BatchBounds], limits: Sequence[int], gpus: int
) -> JobRules:
    """The GPU counts and batches each job may run with under its (effective) limit.

    Vectorized `BatchBounds.batch_for` over every GPU count from 0 to `gpus`.
    """
    count = np.arange(gpus + 1, dtype=np.int64)[None, :]

    def column(values: Iterable[int]) -> IntArray:
        return np.fromiter(values, dtype=np.int64, count=len(bounds))[:, None]

    low, high = column(b.min_total for b in bounds), column(b.max_total for b in bounds)
    local_min, local_max = column(b.local_min for b in bounds), column(b.local_max for b in bounds)
    cap, limit = column(b.max_gpus for b in bounds), column(limits)
    batch = np.minimum(np.minimum(limit, high), count * local_max)
    allowed = (count >= 1) & (count <= cap) & (batch >= low) & (batch >= count * local_min)
    batch = np.where(allowed, batch, 0)
    runs = allowed.any(axis=1)
    n_min = np.where(runs, np.argmax(allowed, axis=1), 0)
    n_max = np.where(runs, gpus - np.argmax(allowed[:, ::-1], axis=1), 0)
    return JobRules(
        np.asarray(ids, dtype=np.int64).reshape(len(bounds)),
        batch.astype(np.int64),
        n_min.astype(np.int64),
        n_max.astype(np.int64),
        local_min[:, 0].copy(),
        local_max[:, 0].copy(),
    )
