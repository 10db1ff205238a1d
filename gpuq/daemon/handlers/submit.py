"""submit: validate a job against this server and queue it (or an array)."""

from __future__ import annotations

import dataclasses
import getpass
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


def handle(state: DaemonState, request: Submit) -> dict[str, Any]:
    """Queue the job(s); the same token twice returns the first ids."""
    if request.token:
        existing = state.store.job_ids_for_token(request.token)
        if existing:
            return {"ids": existing, "duplicate": True}
    spec = validate_spec(request.spec)
    spec = dataclasses.replace(spec, user=getpass.getuser())
    check_fits_server(state, spec)
    check_runnable_command(spec.command, spec.cwd, spec.env.get("PATH"))
    for dep in spec.after:
        if state.store.get(dep.job_id) is None:
            raise NotFoundError(
                f"unknown dependency: job {dep.job_id} does not exist",
                "a job can only depend on jobs submitted before it",
            )
    for pattern in (spec.output, spec.error):
        if pattern:
            expand_output_pattern(pattern, 1, 0, 1, spec.name, spec.user)
    if len(request.array) > MAX_ARRAY:
        raise UsageError(f"an array may have at most {MAX_ARRAY} tasks")
    if len(set(request.array)) != len(request.array) or any(i < 0 for i in request.array):
        raise UsageError("array indices must be distinct and non-negative")
    initial = JobState.HELD if spec.hold else JobState.QUEUED
    reason = "held at submission" if spec.hold else "submitted"
    if request.array:
        new = [
            NewJob(dataclasses.replace(spec, array_index=i), initial, reason, array_first=n == 0)
            for n, i in enumerate(request.array)
        ]
    else:
        new = [NewJob(spec, initial, reason)]
    jobs = state.store.insert_jobs(new, time.time(), request.token)
    faults.crash_point("submit-committed")
    for job in jobs:
        state.active[job.id] = job
        state.publish({"type": "job", "job": job.to_dict()})
    state.wake.set()
    return {"ids": [j.id for j in jobs], "duplicate": False}
