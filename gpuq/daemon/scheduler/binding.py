"""Binding: a policy's decision turned into the GPUs each starting job gets.

A policy allocates GPU counts per node (`Decision.allocations`) and may name
the exact GPUs itself (`Decision.bindings`: `fifo` does, since memory shares
and backfill depend on which GPU). Here every pending job the decision runs
becomes a `Placement` on GPU UUIDs: its own binding where the policy gave
one, else free GPUs of the nodes it was allocated, in GPU order, a
multi-GPU job's from one link group (PCIe switch or NVLink) where one has
enough free, else from as few as possible (`gpuq.policies.topology`). A
free GPU is one no gpuq job holds whose foreign memory is within the
tolerance. A job bound to GPUs a running job still holds (one the policy is
preempting, shrinking or moving) waits until they are released, as an
unbound one does: whole GPUs must hold no job, a memory share must fit
beside the shares already there and no whole-GPU or exclusive job. A job
starting its turn on GPUs the time-slicer chose (`turns`) counts only the
jobs holding them that do not wait for a turn themselves: a parked or
stopped job stays resident beside it (the slicer checked that its memory
fits), and the tick starts the turn once the job computing there has left.
A safety net under every policy: a job is never started on a GPU of a node
its placement constraint excludes (`JobView.nodes`), nor on GPUs of another
shape than its spread (`JobView.spread`: one server for a job that is one
process, the same count on each of N servers for a multi-node job); it
stays queued, and says why. Pure: no I/O, unit-tested without a daemon.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpuq.daemon.scheduler.constraints import misplaced, refusal
from gpuq.policies.confine import outside
from gpuq.policies.interface import ClusterState, Decision, JobView
from gpuq.policies.placement import Capacity, Hold
from gpuq.policies.topology import group_key, pick_close

RELEASE_WAIT = "waiting for GPUs the policy expects running jobs to release"
"""Why a job the decision places waits: its GPUs are still held (being preempted, or ending)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Start job `job_id` on `gpu_uuids`, reserving `gpu_mem` bytes on each.

    `gpu_mem` None means the GPUs are the job's alone; `reason` is the
    policy's note on why it starts there (for the event log), if any.
    """

    job_id: int
    gpu_uuids: tuple[str, ...]
    gpu_mem: int | None = None
    reason: str = ""


def placements(
    state: ClusterState, decision: Decision, turns: frozenset[int] = frozenset()
) -> tuple[list[Placement], dict[int, str]]:
    """The pending jobs `decision` starts, bound to GPUs, and why each other pending job waits.

    `turns` are the jobs the time-slicer shares nodes among (module docstring).
    """
    taken = {uuid for job in state.jobs for uuid in job.gpu_uuids}
    taken.update(uuid for bound in decision.bindings.values() for uuid in bound)
    free: dict[str, list[str]] = {}
    groups = {gpu.uuid: group_key(gpu, i) for i, gpu in enumerate(state.gpus)}
    for gpu in state.gpus:
        if gpu.uuid not in taken and gpu.memory_foreign <= state.foreign_tolerance:
            free.setdefault(gpu.node, []).append(gpu.uuid)
    pending = {job.id: job for job in state.jobs if not job.gpu_uuids}
    node_of = {gpu.uuid: gpu.node for gpu in state.gpus}
    server_of = {gpu.uuid: gpu.server or gpu.node for gpu in state.gpus}
    held: Capacity | None = None
    computing: Capacity | None = None  # what jobs not waiting for a turn hold, for `turns`
    if turns:
        awake = tuple(job for job in state.jobs if not (job.suspended and job.id in turns))
        computing = Capacity.from_state(replace(state, jobs=awake))
    starts: list[Placement] = []
    waiting: dict[int, str] = {}
    for job_id, allocation in decision.allocations.items():  # the policy's order
        job = pending.get(job_id)
        if job is None or not any(allocation):
            continue
        uuids = decision.bindings.get(job_id)
        wrong = (
            misplaced(node_of, job, uuids) if uuids is not None else outside(state, job, allocation)
        )
        if wrong:
            waiting[job_id] = f"not started: {refusal(job, wrong)}"
            continue
        if uuids is not None:
            held = held or Capacity.from_state(state)
            room = computing if job_id in turns and computing is not None else held
            hold = Hold(job_id, tuple(room.index.get(u, -1) for u in uuids), job.gpu_mem)
            if not _free_for(room, hold, job.exclusive):
                waiting[job_id] = RELEASE_WAIT
                continue
            for capacity in {id(held): held, id(room): room}.values():
                capacity.hold(Hold(job_id, hold.gpus, job.gpu_mem, job.exclusive))
        if uuids is None:
            chosen: list[str] = []
            for node, count in zip(state.nodes, allocation, strict=False):
                node_free = free.get(node.name, [])
                picked = pick_close(node_free, groups.__getitem__, count)
                chosen.extend(picked)
                free[node.name] = [uuid for uuid in node_free if uuid not in picked]
            if len(chosen) < sum(allocation):
                waiting[job_id] = RELEASE_WAIT
                continue
            uuids = tuple(chosen)
        shape = misshaped(node_of, job, uuids, server_of)
        if shape:
            waiting[job_id] = f"not started: {shape}"
            continue
        starts.append(Placement(job_id, uuids, job.gpu_mem, decision.notes.get(job_id, "")))
    started = {placement.job_id for placement in starts}
    for job_id in pending:
        if job_id not in started and job_id not in waiting:
            waiting[job_id] = decision.notes.get(job_id, "waiting for the policy to start it")
    return starts, waiting


def misshaped(
    node_of: Mapping[str, str],
    job: JobView,
    uuids: Sequence[str],
    server_of: Mapping[str, str] | None = None,
) -> str:
    """Why `uuids` do not have `job`'s spread (module docstring), or "" if they do.

    `server_of` names each GPU's server where the view splits a server by
    GPU type (`gpuq.daemon.scheduler.view`): the parts of a multi-node job
    run on different servers, not on two types of one.
    """
    if job.spread is None or not uuids:
        return ""
    counts: dict[str, int] = {}
    for uuid in uuids:
        node = node_of.get(uuid, "an unknown node")
        counts[node] = counts.get(node, 0) + 1
    servers = {(server_of or node_of).get(uuid, "an unknown node") for uuid in uuids}
    if len(servers) < len(counts):
        given = ", ".join(f"{count} on {node}" for node, count in counts.items())
        return f"the policy gave it GPUs of several types of one server ({given})"
    if len(counts) == job.spread and len(set(counts.values())) == 1:
        return ""
    given = ", ".join(f"{count} on {node}" for node, count in counts.items())
    if job.spread == 1:
        return f"the policy gave it GPUs on several servers ({given}); it runs on one"
    per_node = len(uuids) // job.spread
    return f"the policy gave it {given}; it runs {per_node} GPU(s) on each of {job.spread} servers"


def _free_for(held: Capacity, hold: Hold, exclusive: bool) -> bool:
    """True if the GPUs of `hold` can take it now, beside what running jobs hold."""
    for i in hold.gpus:
        if i < 0 or held.owners[i]:
            return False
        if hold.gpu_mem is None or exclusive:
            if held.sharers[i]:
                return False
        elif held.usable[i] - held.shares[i] < hold.gpu_mem:
            return False
    return True
