"""Optimus+Oracle: greedy marginal gain over remaining iterations, on whole GPUs.

Optimus (EuroSys'18) adds one task at a time to the job whose completion
time drops the most (optimus_afs.md A.4). The Pollux evaluation runs it with
Pollux's throughput model, the exact remaining iterations (an oracle in the
simulator) and each job's own batch size (ones_pollux.md 3.5); this module
follows that artifact (`simulator/optimus.py`). Rules, each tested in
tests/test_policy_optimus.py:

Minimum
    Every active job first gets one GPU, in submission order (submit time,
    then id; the artifact's job order), while GPUs last; jobs beyond the
    cluster's GPU count get none and wait.

Greedy
    Each remaining GPU goes to the job with the largest marginal gain
    `(t_step(n) - t_step(n + 1)) * remaining_iterations`, where `t_step(n)`
    is the step time at the job's fixed batch size on `n` GPUs packed onto
    as few nodes as possible (`gpuq.policies.baselines.fixed_batch_step_time`
    with the job's fitted model). Only the chosen job's gain is recomputed.
    Ties go to the earlier job in submission order. It stops when GPUs run
    out or no gain is positive, so a job that gets slower with more GPUs
    gets no more.

Caps
    A job never gets more than `max_replicas = batch_size // min_local_bsz`
    GPUs (`local_bsz_bounds[0]`), nor more than its `max_gpus` or the
    cluster. A job without a batch size is capped at `gpus_requested`.

Unknowns
    A job without a fitted model is assumed to scale linearly from
    `unknown_step_time` seconds per step on one GPU. A job whose remaining
    iterations are unknown, or already zero, counts 1 remaining iteration
    (the artifact's value for a job past its last epoch), so it gets GPUs
    beyond its first only when no job with known work gains more.

Placement
    A job whose GPU count is unchanged keeps its GPUs; the others are placed
    in increasing GPU count (then submission order) on the node with the
    most free GPUs first (`FreeGpus.place`, the artifact's `most_common`).
    A job with a placement constraint (`JobView.nodes`) is placed first, on
    its own nodes only, with as many of its GPUs as they have free.

No randomness: `seed` exists only so every policy is built the same way.
"""

from __future__ import annotations

import heapq

from gpuq.policies.baselines import (
    Allocation,
    FreeGpus,
    current_allocation,
    fixed_batch_step_time,
    gpus_per_node,
    submission_order,
)
from gpuq.policies.confine import allowed_nodes, node_names
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView


class OptimusPolicy:
    """Greedy marginal-gain GPU allocation with an oracle for remaining work."""

    name: str = "optimus"
    capabilities = Capabilities(preemption=True, remaining_work=True)

    def __init__(self, seed: int = 0, unknown_step_time: float = 1.0) -> None:
        self.seed = seed
        self.unknown_step_time = unknown_step_time

    @staticmethod
    def max_replicas(job: JobView, total_gpus: int) -> int:
        """The most GPUs the job may get: batch size over the smallest per-GPU batch."""
        if job.batch_size > 0:
            cap = job.batch_size // max(job.local_bsz_bounds[0], 1)
        else:
            cap = job.gpus_requested
        return max(1, min(cap, job.max_gpus, total_gpus))

    @staticmethod
    def remaining(job: JobView) -> float:
        """Remaining iterations at the job's batch size; 1 when unknown or done."""
        iterations = job.remaining_iterations
        return iterations if iterations is not None and iterations > 0 else 1.0

    def replica_counts(self, state: ClusterState) -> dict[int, int]:
        """GPUs per job id: one each in submission order, then by marginal gain."""
        per_node = gpus_per_node(state)
        left = state.total_gpus
        order = submission_order(state.jobs)
        counts: dict[int, int] = {}
        heap: list[tuple[float, int, int]] = []
        jobs: dict[int, JobView] = {}
        caps: dict[int, int] = {}

        def gain(job: JobView, count: int) -> float:
            if count + 1 > caps[job.id]:
                return 0.0
            now_step = fixed_batch_step_time(job, count, per_node, self.unknown_step_time)
            next_step = fixed_batch_step_time(job, count + 1, per_node, self.unknown_step_time)
            return (now_step - next_step) * self.remaining(job)

        for rank, job in enumerate(order):
            if left < 1:
                counts[job.id] = 0
                continue
            counts[job.id] = 1
            left -= 1
            jobs[job.id] = job
            caps[job.id] = self.max_replicas(job, state.total_gpus)
            heapq.heappush(heap, (-gain(job, 1), rank, job.id))
        while left > 0 and heap and -heap[0][0] > 0:
            _, rank, job_id = heapq.heappop(heap)
            counts[job_id] += 1
            left -= 1
            heapq.heappush(heap, (-gain(jobs[job_id], counts[job_id]), rank, job_id))
        return counts

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Allocate GPUs by greedy marginal gain and place them, keeping unchanged jobs."""
        counts = self.replica_counts(state)
        free = FreeGpus(state)
        allocations: dict[int, Allocation] = {}
        to_place: list[JobView] = []
        notes: dict[int, str] = {}
        for job in submission_order(state.jobs):
            count = counts[job.id]
            if count == 0:
                notes[job.id] = "waiting: every GPU already gives another job its minimum"
                continue
            kept = current_allocation(job, len(state.nodes))
            if kept is not None and sum(kept) == count and free.take(kept):
                allocations[job.id] = kept
            else:
                to_place.append(job)
        to_place.sort(key=lambda job: (job.nodes is None, counts[job.id]))
        for job in to_place:
            allowed = allowed_nodes(state, job)
            placed = free.place(counts[job.id], allowed)
            if placed is None and job.nodes is not None:
                fewer = min(counts[job.id], free.total_on(allowed))
                placed = free.place(fewer, allowed)
                if placed is None:
                    notes[job.id] = f"waiting: no free GPU on {node_names(job.nodes)}"
                    continue
            if placed is None:
                # Only when the state's own allocations over-commit a node.
                notes[job.id] = f"waiting: {counts[job.id]} GPUs do not fit"
                continue
            allocations[job.id] = placed
        for job_id, allocation in allocations.items():
            notes[job_id] = f"{sum(allocation)} GPUs by marginal gain"
        return Decision(allocations=allocations, notes=notes)
