"""submit: validate a job against the servers it may run on and queue it (or an array)."""

from __future__ import annotations

import dataclasses
import getpass
import os
import time
from collections.abc import Sequence
from typing import Any

from gpuq.daemon import faults
from gpuq.daemon.access import require_priority
from gpuq.daemon.identity import Caller
from gpuq.daemon.lifecycle import check_runnable_command
from gpuq.daemon.scheduler.constraints import (
    KnownNodes,
    check_gpu_types,
    check_submit,
    eligible_nodes,
    known_nodes,
)
from gpuq.daemon.state import DaemonState
from gpuq.daemon.store import NewJob
from gpuq.errors import NotFoundError, PermissionDenied, ResourceError, UsageError
from gpuq.fairshare import queued_limit_reason
from gpuq.models import GpuInfo, JobSpec, JobState
from gpuq.policies.confine import node_names
from gpuq.protocol import Submit, validate_spec
from gpuq.units import expand_output_pattern, format_size, format_size_at_most

MAX_ARRAY = 10_000


def check_fits_server(state: DaemonState, spec: JobSpec) -> None:
    """Reject requests the job's nodes can never satisfy (`check_fits`), naming what they have."""
    config = state.config
    check_fits(
        spec,
        state.gpus.devices,
        known_nodes(config),
        config.daemon.node_name,
        config.scheduler.memory_margin,
    )


def check_fits(
    spec: JobSpec,
    devices: Sequence[GpuInfo],
    known: KnownNodes,
    local: str,
    memory_margin: float,
) -> None:
    """Reject requests the GPUs of the job's nodes can never satisfy (ResourceError).

    The job is judged against the GPUs of the nodes it may run on (all the
    `known` nodes, or those its placement constraint allows), as `devices`
    (each GPU with its node) has them now. A configured server whose GPUs
    are not among them (down, or not sampled yet) may come back with
    enough: while one of the job's nodes is such a server, nothing is
    refused. `local` is this machine's node, whose GPUs are always sampled.
    """
    if spec.gpus == 0:
        return
    nodes = eligible_nodes(spec, known)
    allowed = set(known) if nodes is None else set(nodes)
    if allowed - {gpu.node for gpu in devices} - {local}:
        return  # a server of the job's not seen yet: it may hold the job when it is
    mine = [gpu for gpu in devices if gpu.node in allowed]
    names = node_names(frozenset(allowed))
    where = "this server has" if allowed == {local} else f"{names} {_has(len(allowed))}"
    if not mine:
        raise ResourceError(
            f"the job needs {spec.gpus} GPU(s) but {where} none",
            "use --gpus 0 for a CPU-only job, or declare [[gpus.fake]] in the config",
        )
    if spec.gpus > len(mine):
        if spec.gpus_max is not None:  # an adaptive job: its range's lower end is what it needs
            raise ResourceError(
                f"the job needs at least {spec.gpus} GPUs (--gpus {spec.gpus}-{spec.gpus_max}); "
                f"{where} {len(mine)}",
                f"start the range at {len(mine)} or fewer, e.g. --gpus 1-{spec.gpus_max}",
            )
        raise ResourceError(
            f"the job needs {spec.gpus} GPUs; {where} {len(mine)}",
            f"use --gpus {len(mine)} or fewer",
        )
    if spec.multi_node:
        _check_parts_fit(spec, mine)
    if spec.gpu_mem is not None:
        largest = max(int(g.memory_total * (1 - memory_margin)) for g in mine)
        if spec.gpu_mem > largest:
            here = "here" if allowed == {local} else f"on {names}"
            raise ResourceError(
                f"--gpu-mem {format_size(spec.gpu_mem)} is more than any GPU {here} can give "
                f"({format_size_at_most(largest)} after the {memory_margin:.0%} safety margin)",
                "ask for less memory, or for a whole GPU without --gpu-mem",
            )


def _check_parts_fit(spec: JobSpec, mine: Sequence[GpuInfo]) -> None:
    """Refuse a multi-node job unless enough of its servers each have GPUs for a part."""
    per_node = spec.gpus // spec.node_count
    counts: dict[str, int] = {}
    for gpu in mine:
        counts[gpu.node] = counts.get(gpu.node, 0) + 1
    big = sorted(name for name, count in counts.items() if count >= per_node)
    if len(big) < spec.node_count:
        have = ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
        largest = sorted(counts.values(), reverse=True)[: spec.node_count]
        most = min(largest) if len(largest) == spec.node_count else 0
        hint = f"use --gpus {most * spec.node_count} or fewer" if most else "ask for fewer --nodes"
        raise ResourceError(
            f"the job needs {per_node} GPU(s) on each of {spec.node_count} servers; "
            f"its servers have {have}",
            hint,
        )


def _has(count: int) -> str:
    return "has" if count == 1 else "have"


def check_output_pattern(pattern: str, spec: JobSpec, *, probe: bool = True) -> None:
    """Refuse a bad placeholder, a directory, and an absolute pattern whose directory is missing.

    gpuq creates missing directories only below the job's working directory
    (`gpuq.daemon.outputs`), so a missing directory elsewhere would fail the
    job at its start: better said now.
    """
    expand_output_pattern(pattern, 1, 0, 1, spec.name, spec.user)
    if pattern.endswith("/") or (
        probe and "%" not in pattern and os.path.isdir(os.path.join(spec.cwd, pattern))
    ):
        raise UsageError(
            f"output pattern {pattern!r} names a directory, not a file",
            f"name a file in it, such as {os.path.join(pattern, '%x-%j.out')}",
        )
    directory = os.path.dirname(pattern)
    if probe and os.path.isabs(pattern) and "%" not in directory and not os.path.isdir(directory):
        raise UsageError(
            f"the directory {directory} of output pattern {pattern!r} does not exist",
            f"create it (mkdir -p {directory}), or use a pattern relative to the working "
            "directory, below which gpuq creates missing directories",
        )


def check_queue_limit(state: DaemonState, caller: Caller, adding: int) -> None:
    """Refuse a submission that would take the user past `[lab] max_queued` waiting jobs."""
    limit = state.config.lab.max_queued
    if not limit:
        return
    waiting = sum(
        1
        for job in state.active.values()
        if job.spec.uid == caller.uid and job.state in (JobState.QUEUED, JobState.HELD)
    )
    reason = queued_limit_reason(caller.name, waiting, limit, adding)
    if reason is not None:
        raise PermissionDenied(
            reason, "wait for some to start, or cancel some (gpuq ls; gpuq cancel ID)"
        )


def handle(state: DaemonState, request: Submit, caller: Caller) -> dict[str, Any]:
    """Queue the job(s); the same token twice returns the first ids.

    An array gets an id of its own (`array_id`), ahead of its tasks' ids.
    """
    lab = state.config.lab.enabled
    token = f"{caller.uid}:{request.token}" if lab and request.token else request.token
    if token:
        existing = state.store.job_ids_for_token(token)
        if existing:
            first = state.store.get(existing[0])
            array_id = None if first is None else first.array_id
            return {"ids": existing, "array_id": array_id, "duplicate": True}
    state.require_state_dir()
    spec = validate_spec(request.spec, array=bool(request.array))
    user = caller.name if lab else getpass.getuser()
    spec = dataclasses.replace(spec, user=user, uid=caller.uid)  # the kernel's, not the request's
    known = known_nodes(state.config)
    check_submit(spec, known)
    seen = {gpu.node for gpu in state.gpus.devices}
    check_gpu_types(spec, state.gpus.devices, (node for node in known if node not in seen))
    if spec.multi_node and not state.policy.capabilities.multi_node:
        raise UsageError(
            f"the scheduler policy {state.policy.name!r} cannot place multi-node jobs",
            'set scheduler.policy = "gpuq" (the default) or "fifo" in the config',
        )
    check_fits_server(state, spec)
    # A lab daemon runs as root: it must not probe paths for another user (the
    # answer would tell them what root can see). The job's start says why it failed.
    probe = not lab or caller.uid == os.geteuid()
    if probe:
        check_runnable_command(spec.command, spec.cwd, spec.env.get("PATH"))
    for dep in spec.after:
        if state.dependency_state(dep.job_id) is None:
            raise NotFoundError(
                f"unknown dependency: no job or array {dep.job_id}",
                "a job can only depend on jobs and arrays submitted before it",
            )
    for pattern in (spec.output, spec.error):
        if pattern:
            check_output_pattern(pattern, spec, probe=probe)
    if len(request.array) > MAX_ARRAY:
        raise UsageError(f"an array may have at most {MAX_ARRAY} tasks")
    if len(set(request.array)) != len(request.array) or any(i < 0 for i in request.array):
        raise UsageError("array indices must be distinct and non-negative")
    if lab:
        require_priority(state.config, caller, spec.priority)
        check_queue_limit(state, caller, len(request.array) or 1)
    initial = JobState.HELD if spec.hold else JobState.QUEUED
    reason = "held at submission" if spec.hold else "submitted"
    if request.array:
        new = [
            NewJob(dataclasses.replace(spec, array_index=i), initial, reason) for i in request.array
        ]
    else:
        new = [NewJob(spec, initial, reason)]
    jobs, array_id = state.store.insert_jobs(new, time.time(), token, array=bool(request.array))
    faults.crash_point("submit-committed")
    state.remember_ids(jobs[-1].id)
    for job in jobs:
        state.active[job.id] = job
        state.publish({"type": "job", "job": job.to_dict()})
    state.wake.set()
    return {"ids": [j.id for j in jobs], "array_id": array_id, "duplicate": False}
