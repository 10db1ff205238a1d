"""Tiresias: discretized two-dimensional least-attained-service (2D-LAS), gang.

As the Pollux artifact runs it (`simulator/tiresias.py`, notes: ones_pollux.md
3.5), each rule tested in tests/test_policy_tiresias.py:

Queues
    A job's attained service is GPUs x seconds it has run
    (`JobView.attained_service`; the artifact's executed time x
    `max_replicas` is the same number for a gang job). It sits in queue 0
    until its service reaches the first threshold, 16 GPU-hours by default
    (`thresholds_gpu_hours`, configurable; more thresholds give more queues,
    as in the Tiresias paper), then in queue 1, and so on. Demotion is
    therefore immediate at the threshold and never undone: the starvation
    knob (PromoteKnob) is off, as in the Pollux evaluation.

Order
    Queue 0 first, then queue 1; within a queue, FIFO by submit time, then
    id. The artifact appends a demoted job at the tail of queue 1, i.e.
    orders queue 1 by demotion time; a pure policy does not know when a
    job crossed the threshold, so submission order is used there too.

Gang and preemption
    Walking that order, a job runs if its `gpus_requested` fit in the GPUs
    not yet given to an earlier job (counting GPUs, not nodes: a gang may
    span nodes); a job that does not fit is skipped and later jobs may still
    run. A running job that no longer fits in this order is preempted.

Placement
    A job that keeps running keeps its GPUs (no needless reallocation); a job
    that starts goes to the node with the most free GPUs, then the next
    (`gpuq.policies.baselines.FreeGpus.place`, the artifact's `most_common`),
    which puts it on as few nodes as possible.

No randomness: `seed` exists only so every policy is built the same way.
"""

from __future__ import annotations

import bisect
from itertools import pairwise

from gpuq.errors import UsageError
from gpuq.policies.baselines import gang_admit
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView

GPU_HOUR = 3600.0


class TiresiasPolicy:
    """Discretized 2D-LAS with gang scheduling (module docstring)."""

    name: str = "tiresias"
    capabilities = Capabilities(preemption=True)

    def __init__(
        self, seed: int = 0, thresholds_gpu_hours: float | tuple[float, ...] = (16.0,)
    ) -> None:
        if isinstance(
            thresholds_gpu_hours, int | float
        ):  # one threshold, as a spec option gives it
            thresholds_gpu_hours = (float(thresholds_gpu_hours),)
        if any(hours <= 0 for hours in thresholds_gpu_hours):
            raise UsageError(f"tiresias thresholds must be positive: {thresholds_gpu_hours}")
        if any(b <= a for a, b in pairwise(thresholds_gpu_hours)):
            raise UsageError(f"tiresias thresholds must increase: {thresholds_gpu_hours}")
        self.seed = seed
        self.thresholds = tuple(hours * GPU_HOUR for hours in thresholds_gpu_hours)

    def queue(self, job: JobView) -> int:
        """The job's queue: how many thresholds its attained service has reached."""
        return bisect.bisect_right(self.thresholds, job.attained_service)

    def order(self, jobs: tuple[JobView, ...]) -> list[JobView]:
        """Jobs in scheduling order: queue, then submit time, then id."""
        return sorted(jobs, key=lambda job: (self.queue(job), job.submit_time, job.id))

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Run jobs in queue order where their gang fits; preempt the rest."""
        decision = gang_admit(state, self.order(state.jobs))
        notes = {}
        for job in state.jobs:
            detail = decision.notes.get(job.id)
            label = f"queue {self.queue(job)}"
            notes[job.id] = f"{label}, {detail}" if detail else label
        return Decision(allocations=decision.allocations, notes=notes)
