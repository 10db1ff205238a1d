"""Baselines: `srtf` and `srsf`, and the helpers they share with Tiresias and Optimus.

These are the non-adaptive reference points of the papers: every job runs
with exactly the GPUs it asked for (`gpus_requested`, gang scheduling) or not
at all, and keeps its own batch size (`capabilities.adaptive_jobs` False). Tiresias
(`gpuq.policies.tiresias`) and Optimus (`gpuq.policies.optimus`) reuse the
helpers defined here. None of them uses randomness; the `seed` argument
exists only so that every policy is built the same way.

`fifo` is the daemon's policy, `gpuq.policies.fifo`, which the simulator
runs too. Choices the papers leave open, each tested in
tests/test_policy_baselines.py:

Placement (all baselines)
    A job that keeps running keeps its GPUs. A job that starts is placed on
    the node with the most free GPUs, taking as many as it can there, then
    the next such node (ties: the earlier node of `state.nodes`). This is the
    Pollux artifact's `Counter.most_common` rule: it uses as few nodes as
    possible for the job being placed. A job with a placement constraint
    (`JobView.nodes`) is placed only on its nodes, and before the other jobs
    admitted with it (admission has chosen who runs; it has fewer choices);
    where its nodes lack the GPUs admission counted for it, it waits.

`srtf` and `srsf`
    Rank every active job by its remaining time at its requested GPU count
    (`srtf`), or by that time multiplied by the GPU count, the remaining GPU
    service (`srsf`); ties by submit time then id. The remaining time is
    `remaining_iterations` times the step time at the job's fixed batch size
    on `gpus_requested` GPUs packed onto as few nodes as possible, predicted
    by the job's throughput model (`fixed_batch_step_time`). A job with no
    model is assumed to scale linearly from `unknown_step_time` seconds per
    step on one GPU; a job whose remaining work is unknown ranks after every
    job whose work is known. Preemptive: the ranking is recomputed every
    decision and a running job that no longer fits in rank order loses its
    GPUs. A job that does not fit is skipped and later, shorter-ranked jobs
    that fit still run (the AFS paper does not say; skipping keeps GPUs busy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from gpuq.policies.confine import allowed_nodes, node_names
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView

if TYPE_CHECKING:
    from gpuq.goodput import GoodputFunction

Allocation = tuple[int, ...]


class FreeGpus:
    """Free GPUs per node (in `state.nodes` order) while a policy hands them out."""

    __slots__ = ("free",)

    def __init__(self, state: ClusterState) -> None:
        self.free = [max(node.gpus, 0) for node in state.nodes]

    @property
    def total(self) -> int:
        """Free GPUs over all nodes."""
        return sum(self.free)

    def take(self, allocation: Allocation) -> bool:
        """Book `allocation` if it is well formed and fits; False (and no change) if not."""
        if len(allocation) != len(self.free) or sum(allocation) <= 0:
            return False
        if any(
            count < 0 or count > free for count, free in zip(allocation, self.free, strict=True)
        ):
            return False
        for i, count in enumerate(allocation):
            self.free[i] -= count
        return True

    def total_on(self, allowed: Sequence[bool] | None) -> int:
        """Free GPUs over the nodes `allowed` marks (None: every node)."""
        if allowed is None:
            return self.total
        return sum(free for free, ok in zip(self.free, allowed, strict=True) if ok)

    def place(self, count: int, allowed: Sequence[bool] | None = None) -> Allocation | None:
        """Book `count` GPUs, most-free node first, or return None if they do not fit.

        `allowed` marks the nodes the job may use (None: all; `confine.allowed_nodes`).
        """
        if count <= 0 or count > self.total_on(allowed):
            return None
        allocation = [0] * len(self.free)
        nodes = [i for i in range(len(self.free)) if allowed is None or allowed[i]]
        left = count
        while left > 0:
            best = max(nodes, key=lambda i: (self.free[i], -i))
            taken = min(self.free[best], left)
            allocation[best] += taken
            self.free[best] -= taken
            left -= taken
        return tuple(allocation)


def current_allocation(job: JobView, node_count: int) -> Allocation | None:
    """The job's allocation if it is running on a well-formed one, else None."""
    allocation = job.allocation
    if len(allocation) != node_count or any(count < 0 for count in allocation):
        return None
    return allocation if sum(allocation) > 0 else None


def gpus_per_node(state: ClusterState) -> int:
    """GPUs of the largest node (at least 1), for packed-placement predictions."""
    return max((node.gpus for node in state.nodes), default=1) or 1


def fixed_batch_step_time(
    job: JobView, replicas: int, per_node: int, unknown_step_time: float = 1.0
) -> float:
    """Seconds per step of `job` at its own batch size on `replicas` packed GPUs.

    The batch is split evenly over the replicas; when a replica's share is
    larger than `local_bsz_bounds[1]` the job accumulates gradients over
    several micro-batches, as the Pollux artifact's Optimus does. The artifact
    also forces one accumulation step on a single replica, an artefact of its
    measured tables that a fitted model does not need, so it is not copied.
    Without a model or a batch size, the job scales linearly from
    `unknown_step_time` seconds on one GPU.
    """
    replicas = max(replicas, 1)
    if job.goodput is None or job.batch_size <= 0:
        return unknown_step_time / replicas
    max_batch = job.max_batch_size if job.max_batch_size > 0 else job.batch_size
    return _model_step_time(
        job.goodput, job.batch_size, job.local_bsz_bounds[1], max_batch, replicas, per_node
    )


@lru_cache(maxsize=1 << 16)
def _model_step_time(
    model: GoodputFunction,
    batch_size: int,
    max_local_bsz: int,
    max_batch: int,
    replicas: int,
    per_node: int,
) -> float:
    """`fixed_batch_step_time` for a job with a model, memoized (models are immutable)."""
    nodes = math.ceil(replicas / max(per_node, 1))
    local_bsz = math.ceil(batch_size / replicas)
    accum_steps = math.ceil(local_bsz / max(max_local_bsz, 1)) - 1
    micro_bsz = math.ceil(local_bsz / (accum_steps + 1))
    micro_bsz = max(1, min(micro_bsz, max_batch // (replicas * (accum_steps + 1))))
    return float(model.step_time(nodes, replicas, micro_bsz, accum_steps))


def gang_admit(state: ClusterState, order: Iterable[JobView]) -> Decision:
    """Run jobs in `order` with exactly their requested GPUs, skipping what does not fit.

    Admission counts GPUs (a gang may span nodes). Admitted jobs that already
    hold that many GPUs keep them; the others are then placed in `order` on
    the most-free nodes (constrained jobs first, on their own nodes). A
    running job that is not admitted is preempted.
    """
    left = state.total_gpus
    admitted: list[JobView] = []
    notes: dict[int, str] = {}
    preempted: list[JobView] = []
    for job in order:
        need = job.gpus_requested
        if need <= 0:
            continue
        if need <= left:
            admitted.append(job)
            left -= need
        elif job.running:
            preempted.append(job)
        else:
            notes[job.id] = f"waiting: needs {_gpus(need)}, {left} left in rank order"
    newcomers = [job.id for job in admitted if not job.running]
    for job in preempted:
        ahead = f"for job {newcomers[0]}, " if newcomers else ""
        notes[job.id] = f"preempted {ahead}ahead of it in rank order"
    free = FreeGpus(state)
    allocations: dict[int, Allocation] = {}
    to_place: list[JobView] = []
    for job in admitted:
        kept = current_allocation(job, len(state.nodes))
        if kept is not None and sum(kept) == job.gpus_requested and free.take(kept):
            allocations[job.id] = kept
        else:
            to_place.append(job)
    to_place.sort(key=lambda job: job.nodes is None)  # stable: rank order otherwise
    for job in to_place:
        placed = free.place(job.gpus_requested, allowed_nodes(state, job))
        if placed is None and job.nodes is not None:
            notes[job.id] = (
                f"waiting: needs {_gpus(job.gpus_requested)} on {node_names(job.nodes)}, "
                f"{free.total_on(allowed_nodes(state, job))} free there"
            )
            continue
        if placed is None:
            # Only when the state's own allocations over-commit a node.
            notes[job.id] = f"waiting: needs {_gpus(job.gpus_requested)}"
            continue
        allocations[job.id] = placed
    return Decision(allocations=allocations, notes=notes)


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def submission_order(jobs: Iterable[JobView]) -> list[JobView]:
    """Jobs by submit time, then id."""
    return sorted(jobs, key=lambda job: (job.submit_time, job.id))


class _ShortestRemaining:
    """Gang scheduling by remaining time (SRTF) or remaining GPU service (SRSF)."""

    name: str = ""
    capabilities = Capabilities(preemption=True, remaining_work=True)
    by_service: bool = False

    def __init__(self, seed: int = 0, unknown_step_time: float = 1.0) -> None:
        self.seed = seed
        self.unknown_step_time = unknown_step_time

    def remaining(self, job: JobView, per_node: int) -> float:
        """The ranking key: remaining seconds (times GPUs for SRSF); inf if unknown."""
        if job.remaining_iterations is None:
            return math.inf
        step = fixed_batch_step_time(job, job.gpus_requested, per_node, self.unknown_step_time)
        seconds = max(job.remaining_iterations, 0.0) * step
        return seconds * max(job.gpus_requested, 1) if self.by_service else seconds

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Run the jobs with the least remaining work that fit, preempting the rest."""
        per_node = gpus_per_node(state)
        keyed = [
            (self.remaining(job, per_node), job.submit_time, job.id, job) for job in state.jobs
        ]
        keyed.sort(key=lambda item: item[:3])
        return gang_admit(state, [item[3] for item in keyed])


class SrtfPolicy(_ShortestRemaining):
    """Shortest remaining time first, at the requested GPU count (module docstring)."""

    name = "srtf"


class SrsfPolicy(_ShortestRemaining):
    """Shortest remaining service (time x GPUs) first (module docstring)."""

    name = "srsf"
    by_service = True
