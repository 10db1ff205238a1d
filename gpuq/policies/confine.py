"""Placement constraints in policies: the nodes a job may use, and a guard for any decision.

A job's `JobView.nodes` names the nodes it may hold GPUs on (None: any
node); the daemon sets it from `gpuq submit --node`, `--exclude-node` and
`--label`. Every policy places a job only there, each with its own rules:

- `fifo` and `gpuq` leave the GPUs of other nodes out of the job's choice
  (`gpuq.policies.placement.Capacity.outside`), moves and preemption
  included;
- the baselines (`srtf`, `srsf`, `tiresias`) and `optimus` take the most
  free of the job's nodes (`allowed_nodes`), placing constrained jobs
  before the others once admission has chosen who runs (they have fewer
  choices);
- Pollux's search (`pollux`, and `gpuq`'s goodput step) never gives a job
  GPUs on a node outside its mask (`SearchProblem.allowed`);
- Gandiva's Algorithm 1, its migrations and its packing consider only the
  job's nodes;
- `afs` and `ones` decide GPU counts without looking at nodes; their
  decisions go through `confine`.

`confine` keeps any decision within the constraints: a job whose new
allocation uses a node it may not run on gets the same count on its own
nodes, most free first (after every other job's allocation), else, if it is
running, what it holds now, else nothing, with a note saying why. A running
job always keeps what it holds, wherever that is (its constraint was met
when it started). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpuq.policies.interface import ClusterState, Decision, JobView


def allowed_nodes(state: ClusterState, job: JobView) -> tuple[bool, ...]:
    """For each node of `state.nodes`, in order: whether `job` may hold GPUs there."""
    return tuple(job.may_run_on(node.name) for node in state.nodes)


def node_names(nodes: frozenset[str] | None) -> str:
    """`gpu2`, or `gpu2, gpu3`, sorted: a job's nodes, for reasons ("any node": None)."""
    return "any node" if nodes is None else ", ".join(sorted(nodes)) or "no node"


def outside(state: ClusterState, job: JobView, allocation: Sequence[int]) -> list[str]:
    """The nodes of `allocation` (GPUs per node of `state.nodes`) that `job` may not use."""
    return [
        node.name
        for node, count in zip(state.nodes, allocation, strict=False)
        if count > 0 and not job.may_run_on(node.name)
    ]


def confine(state: ClusterState, decision: Decision) -> Decision:
    """`decision` with every job's new GPUs on nodes it may use (module docstring)."""
    if all(job.nodes is None for job in state.jobs):
        return decision
    jobs = {job.id: job for job in state.jobs}
    misplaced = [
        job_id
        for job_id, allocation in decision.allocations.items()
        if job_id in jobs
        and tuple(allocation) != tuple(jobs[job_id].allocation)
        and outside(state, jobs[job_id], allocation)
    ]
    if not misplaced:
        return decision
    used = [0] * len(state.nodes)
    for job_id, allocation in decision.allocations.items():
        if job_id not in misplaced:
            for i, count in enumerate(allocation[: len(used)]):
                used[i] += count
    allocations = dict(decision.allocations)
    notes = dict(decision.notes)
    for job_id in misplaced:
        job = jobs[job_id]
        chose = ", ".join(outside(state, job, allocations[job_id]))
        placed = _relocate(state, job, sum(allocations[job_id]), used)
        if placed is None and job.running and _fits(state, job.allocation, used):
            placed = tuple(job.allocation)
        if placed is None:
            del allocations[job_id]
            notes[job_id] = (
                f"waiting: the policy chose {chose}, where it may not run, and its nodes "
                f"({node_names(job.nodes)}) have too few free GPUs"
            )
            continue
        allocations[job_id] = placed
        for i, count in enumerate(placed):
            used[i] += count
        note = decision.notes.get(job_id, "")
        where = f"moved off {chose} to its nodes ({node_names(job.nodes)})"
        notes[job_id] = f"{note}; {where}" if note else where
    changed = set(misplaced)
    return replace(
        decision,
        allocations=allocations,
        notes=notes,
        bindings=_without(decision.bindings, changed),
        packed=tuple(group for group in decision.packed if not changed & set(group)),
    )


def _relocate(
    state: ClusterState, job: JobView, count: int, used: list[int]
) -> tuple[int, ...] | None:
    """`count` GPUs on the job's nodes left free by `used`, most free node first; None if not."""
    free = [
        max(node.gpus - taken, 0) if job.may_run_on(node.name) else 0
        for node, taken in zip(state.nodes, used, strict=True)
    ]
    if count <= 0 or sum(free) < count:
        return None
    allocation = [0] * len(free)
    left = count
    while left > 0:
        best = max(range(len(free)), key=lambda i: (free[i], -i))
        taken = min(free[best], left)
        allocation[best] += taken
        free[best] -= taken
        left -= taken
    return tuple(allocation)


def _fits(state: ClusterState, allocation: Sequence[int], used: list[int]) -> bool:
    return len(allocation) == len(used) and all(
        taken + count <= node.gpus
        for node, taken, count in zip(state.nodes, used, allocation, strict=True)
    )


def _without(bindings: Mapping[int, tuple[str, ...]], jobs: set[int]) -> dict[int, tuple[str, ...]]:
    return {job_id: uuids for job_id, uuids in bindings.items() if job_id not in jobs}


__all__ = ["allowed_nodes", "confine", "node_names", "outside"]
