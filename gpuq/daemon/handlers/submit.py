"""submit: validate a job against this server and queue it (or an array)."""

from __future__ import annotations

import dataclasses
import getpass
import os
import time
from typing import Any

from gpuq.daemon import faults
from gpuq.daemon.lifecycle import check_runnable_command
from gpuq.daemon.state import DaemonState
from gpuq.daemon.store import NewJob
from gpuq.errors import NotFoundError, ResourceError, UsageError
from gpuq.models import JobSpec, JobState
from gpuq.protocol import Submit, validate_spec
from gpuq.units import expand_output_pattern, format_size

MAX_ARRAY = 10_000


def check_fits_server(state: DaemonState, spec: JobSpec) -> None:
    """Reject requests this server can never satisfy, naming what it has."""
    devices = state.gpus.devices
    if spec.gpus == 0:
        return
    if not devices:
        raise ResourceError(
            f"the job needs {spec.gpus} GPU(s) but this server has none",
            "use --gpus 0 for a CPU-only job, or declare [[gpus.fake]] in the config",
        )
    if spec.gpus > len(devices):
        raise ResourceError(
            f"the job needs {spec.gpus} GPUs; this server has {len(devices)}",
            f"use --gpus {len(devices)} or fewer",
        )
    if spec.gpu_mem is not None:
        margin = state.config.scheduler.memory_margin
        largest = max(int(g.memory_total * (1 - margin)) for g in devices)
        if spec.gpu_mem > largest:
            raise ResourceError(
                f"--gpu-mem {format_size(spec.gpu_mem)} is more than any GPU here can give "
                f"({format_size(largest)} after the {margin:.0%} safety margin)",
                "ask for less memory, or for a whole GPU without --gpu-mem",
            )


def check_output_pattern(pattern: str, spec: JobSpec) -> None:
    """Refuse a bad placeholder, and an absolute pattern whose directory does not exist.

    gpuq creates missing directories only below the job's working directory
    (`gpuq.daemon.outputs`), so a missing directory elsewhere would fail the
    job at its start: better said now.
    """
    expand_output_pattern(pattern, 1, 0, 1, spec.name, spec.user)
    directory = os.path.dirname(pattern)
    if os.path.isabs(pattern) and "%" not in directory and not os.path.isdir(directory):
        raise UsageError(
            f"the directory {directory} of output pattern {pattern!r} does not exist",
            f"create it (mkdir -p {directory}), or use a pattern relative to the working "
            "directory, below which gpuq creates missing directories",
        )


def handle(state: DaemonState, request: Submit) -> dict[str, Any]:
    """Queue the job(s); the same token twice returns the first ids.

    An array gets an id of its own (`array_id`), ahead of its tasks' ids.
    """
    if request.token:
        existing = state.store.job_ids_for_token(request.token)
        if existing:
            first = state.store.get(existing[0])
            array_id = None if first is None else first.array_id
            return {"ids": existing, "array_id": array_id, "duplicate": True}
    state.require_state_dir()
    spec = validate_spec(request.spec)
    spec = dataclasses.replace(spec, user=getpass.getuser())
    check_fits_server(state, spec)
    check_runnable_command(spec.command, spec.cwd, spec.env.get("PATH"))
    for dep in spec.after:
        if state.dependency_state(dep.job_id) is None:
            raise NotFoundError(
                f"unknown dependency: no job or array {dep.job_id}",
                "a job can only depend on jobs and arrays submitted before it",
            )
    for pattern in (spec.output, spec.error):
        if pattern:
            check_output_pattern(pattern, spec)
    if len(request.array) > MAX_ARRAY:
        raise UsageError(f"an array may have at most {MAX_ARRAY} tasks")
    if len(set(request.array)) != len(request.array) or any(i < 0 for i in request.array):
        raise UsageError("array indices must be distinct and non-negative")
    initial = JobState.HELD if spec.hold else JobState.QUEUED
    reason = "held at submission" if spec.hold else "submitted"
    if request.array:
        new = [
            NewJob(dataclasses.replace(spec, array_index=i), initial, reason) for i in request.array
        ]
    else:
        new = [NewJob(spec, initial, reason)]
    jobs, array_id = state.store.insert_jobs(
        new, time.time(), request.token, array=bool(request.array)
    )
    faults.crash_point("submit-committed")
    state.remember_ids(jobs[-1].id)
    for job in jobs:
        state.active[job.id] = job
        state.publish({"type": "job", "job": job.to_dict()})
    state.wake.set()
    return {"ids": [j.id for j in jobs], "array_id": array_id, "duplicate": False}
