"""migrate: move a running runner job to another node, as the policy's own moves do.

The move is booked to free GPUs of the target node (`scheduler.moves`):
the job checkpoints at its next iteration boundary and exits, its
checkpoint is copied to the target and checked (`gpuq.daemon.transfer`),
and it restarts there from it. Each phase is in the job's event log. A
node outside the job's placement constraint is refused.
"""

from __future__ import annotations

from typing import Any

from gpuq.daemon import suspend
from gpuq.daemon.access import require_owner
from gpuq.daemon.identity import Caller
from gpuq.daemon.scheduler import moves
from gpuq.daemon.scheduler.constraints import eligible_nodes, known_nodes
from gpuq.daemon.state import DaemonState
from gpuq.errors import ConflictError, ResourceError, UsageError
from gpuq.models import JobState
from gpuq.policies.actions import Action, Kind
from gpuq.policies.confine import node_names
from gpuq.protocol import Migrate


def handle(state: DaemonState, request: Migrate, caller: Caller) -> dict[str, Any]:
    """Book the move and ask the job to checkpoint; the reply names the GPUs it goes to."""
    job = state.job(request.id)
    require_owner(state.config, caller, job, "migrate")
    local = state.config.daemon.node_name
    nodes = [local, *state.remotes]
    if request.to not in nodes:
        raise UsageError(
            f"unknown node {request.to!r}",
            f"known: {', '.join(nodes)}; gpuq cluster add {request.to} adds a server",
        )
    allowed = eligible_nodes(job.spec, known_nodes(state.config))
    if allowed is not None and request.to not in allowed:
        raise UsageError(
            f"job {job.id} may not run on {request.to}: it runs only on {node_names(allowed)}",
            "its placement constraint (--node, --exclude-node, --label) is part of its spec",
        )
    if job.spec.multi_node:
        raise ConflictError(
            f"job {job.id} runs on {len(job.part_nodes) or job.spec.node_count} servers: "
            "a multi-node job is not migrated",
            "cancel it and submit it again with --node or --exclude-node",
        )
    if job.state is not JobState.RUNNING:
        raise ConflictError(
            f"job {job.id} is {job.state.value}: only a running job can be migrated",
            "a job suspended to a checkpoint restarts wherever it is placed next",
        )
    if job.node == request.to:
        raise ConflictError(f"job {job.id} already runs on {request.to}")
    if not suspend.can_preempt(state, job):
        raise ConflictError(
            f"job {job.id} cannot checkpoint: its gpuq.runner is not connected",
            "only jobs using gpuq.runner (with checkpoint support) can be migrated",
        )
    remote = state.remotes.get(request.to)
    if remote is not None and remote.mirror is None:
        raise ResourceError(
            f"{request.to} is down: {remote.health.reason or 'it has not answered yet'}",
            "gpuq cluster ls shows each server's state",
        )
    targets = free_gpus(state, request.to)
    wanted = len(job.gpu_uuids)
    if len(targets) < wanted:
        raise ResourceError(
            f"{request.to} has {len(targets)} free GPU(s); job {job.id} needs {wanted}",
            "wait until GPUs free up there (gpuq gpus), or choose another node",
        )
    chosen = tuple(targets[:wanted])
    reason = f"migrating to {request.to}, as asked"
    if not moves.begin(state, job, Action(Kind.MOVE, job.id, reason, gpu_uuids=chosen)):
        raise ConflictError(f"job {job.id}'s move could not be recorded", "gpuq daemon status")
    return {"id": job.id, "from": job.node, "to": request.to, "gpus": list(chosen)}


def free_gpus(state: DaemonState, node: str) -> list[str]:
    """UUIDs of the node's GPUs that no job holds or is moving to, and others leave alone."""
    held = {uuid for job in state.active.values() for uuid in job.gpu_uuids}
    held.update(uuid for move in moves.load(state).moves.values() for uuid in move.target)
    tolerance = state.config.scheduler.foreign_tolerance
    snap = state.gpus
    return [
        gpu.uuid
        for gpu in snap.devices
        if gpu.node == node
        and gpu.uuid not in held
        and snap.foreign_memory.get(gpu.uuid, 0) <= tolerance
    ]
