"""A decision as actions: what must change for the cluster to match it, each with a reason.

A policy answers with the allocations it wants (`Decision`); whoever runs it
needs the changes. `plan(state, decision)` compares the two, one job at a
time, and returns them in the order a caller carries them out, those that
free GPUs first:

- `suspend`: a running job the decision leaves out (mode from
  `Decision.suspend_modes`, else the caller's choice);
- `resize`: a running job given another GPU count;
- `move`: a running job given the same count elsewhere (other nodes, or
  other GPUs where the decision binds them);
- `unpack`: a job that shared its GPUs (`JobView.packed_with`) and no
  longer does;
- `resume`: a suspended job given GPUs;
- `start`: a job that never held any given GPUs;
- `pack`: jobs the decision puts on the same GPUs at once that were not
  packed together before.

A job whose allocation stays as it is gets no action, and a pending or
suspended job the decision leaves out stays as it is. Each action carries the
decision's note for the job as its reason, after a description of the
change ("resized 2 -> 4 GPUs: goodput +38%"; a move to GPUs the decision
binds names them: "moved to GPU 1: frees GPU 0 for job 9"). Pure: the
daemon's actuator and the simulator read the same actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpuq.policies.interface import ClusterState, Decision, JobView
from gpuq.policies.topology import gpus_label, positions_of


class Kind(StrEnum):
    """What an action does to a job, in the order `plan` returns them."""

    SUSPEND = "suspend"
    RESIZE = "resize"
    MOVE = "move"
    UNPACK = "unpack"
    RESUME = "resume"
    START = "start"
    PACK = "pack"


_ORDER = {kind: i for i, kind in enumerate(Kind)}


@dataclass(frozen=True, slots=True)
class Action:
    """One change to one job.

    `allocation` is the job's GPUs per node after the action (empty for a
    suspend) and `previous` before it; `gpu_uuids` the exact GPUs where the
    decision binds them; `mode` the suspend mode the policy asked for, if
    any (suspend, resize and move all take the job off its GPUs first);
    `partners` the other jobs of a pack or unpack.
    """

    kind: Kind
    job_id: int
    reason: str
    allocation: tuple[int, ...] = ()
    previous: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    mode: str | None = None
    partners: tuple[int, ...] = ()


def _with_note(text: str, note: str | None) -> str:
    return f"{text}: {note}" if note else text


def _per_node(state: ClusterState, allocation: tuple[int, ...]) -> str:
    """`2 GPUs on n1` or `4 GPUs (n1: 2, n2: 2)`, for reasons."""
    total = sum(allocation)
    used = [(node.name, n) for node, n in zip(state.nodes, allocation, strict=False) if n > 0]
    gpus = f"{total} GPU" if total == 1 else f"{total} GPUs"
    if len(used) == 1 and len(state.nodes) > 1:
        return f"{gpus} on {used[0][0]}"
    if len(used) > 1:
        return f"{gpus} ({', '.join(f'{name}: {n}' for name, n in used)})"
    return gpus


def _change(job: JobView, state: ClusterState, decision: Decision) -> Action | None:
    """The action that takes `job` where the decision wants it, or None."""
    note = decision.notes.get(job.id)
    target = decision.allocations.get(job.id, ())
    wanted = sum(target) > 0
    bound = decision.bindings.get(job.id, ())
    mode = decision.suspend_modes.get(job.id)
    if job.suspended:
        if not wanted:
            return None
        text = f"resumed on {_per_node(state, target)}"
        return Action(Kind.RESUME, job.id, _with_note(text, note), target, job.allocation, bound)
    if not job.running:
        if not wanted:
            return None
        text = f"started on {_per_node(state, target)}"
        return Action(Kind.START, job.id, _with_note(text, note), target, (), bound)
    if not wanted:
        text = "suspended by the policy"
        return Action(Kind.SUSPEND, job.id, _with_note(text, note), (), job.allocation, mode=mode)
    if sum(target) != job.gpus:
        text = f"resized {job.gpus} -> {sum(target)} GPUs"
        return Action(
            Kind.RESIZE, job.id, _with_note(text, note), target, job.allocation, bound, mode
        )
    moved = tuple(target) != tuple(job.allocation) or (
        bool(bound) and bool(job.gpu_uuids) and tuple(bound) != tuple(job.gpu_uuids)
    )
    if moved:
        where = positions_of(state, bound) if bound else []
        text = f"moved to {gpus_label(state, where) if where else _per_node(state, target)}"
        return Action(
            Kind.MOVE, job.id, _with_note(text, note), target, job.allocation, bound, mode
        )
    return None


def _groups(pairs: dict[int, frozenset[int]]) -> set[frozenset[int]]:
    return {group for group in pairs.values() if len(group) > 1}


def _pack_actions(kind: Kind, members: frozenset[int], decision: Decision) -> list[Action]:
    """One pack or unpack action per member of a group, naming the others."""
    verb = "packed with" if kind is Kind.PACK else "unpacked from"
    actions = []
    for job_id in sorted(members):
        partners = tuple(sorted(members - {job_id}))
        text = f"{verb} job{'s' if len(partners) > 1 else ''} {', '.join(map(str, partners))}"
        note = decision.notes.get(job_id)
        actions.append(Action(kind, job_id, _with_note(text, note), partners=partners))
    return actions


def plan(state: ClusterState, decision: Decision) -> tuple[Action, ...]:
    """The actions that turn `state` into `decision`, in the order to carry them out."""
    actions = [action for job in state.jobs if (action := _change(job, state, decision))]
    before = {job.id: frozenset((job.id, *job.packed_with)) for job in state.jobs}
    after: dict[int, frozenset[int]] = {}
    for group in decision.packed:
        members = frozenset(group)
        for job_id in members:
            after[job_id] = members
    for kind, made in (
        (Kind.UNPACK, _groups(before) - _groups(after)),
        (Kind.PACK, _groups(after) - _groups(before)),
    ):
        for members in sorted(made, key=sorted):
            actions.extend(_pack_actions(kind, members, decision))
    actions.sort(key=lambda action: (_ORDER[action.kind], action.job_id))
    return tuple(actions)


__all__ = ["Action", "Kind", "plan"]
