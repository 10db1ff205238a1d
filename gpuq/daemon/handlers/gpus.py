"""gpus: every GPU, memory split by owner, utilization and jobs; the servers' health."""

from __future__ import annotations

import os
import pwd
from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.protocol import Gpus


def handle(state: DaemonState, request: Gpus) -> dict[str, Any]:
    """The latest sample of every GPU, with gpuq's jobs on each, and each server's health.

    `servers` (as in `status`) lets a client tell a server that is down, whose
    GPUs are missing, from one that has none. `backend` is this daemon's own.
    """
    snap = state.gpus
    reserved: dict[str, int] = {}
    jobs_on: dict[str, list[int]] = {}
    for job in state.active.values():
        if not job.state.is_active:
            continue
        for uuid in job.gpu_uuids:
            jobs_on.setdefault(uuid, []).append(job.id)
            if job.gpu_mem_reserved is not None:
                reserved[uuid] = reserved.get(uuid, 0) + job.gpu_mem_reserved
    out = []
    for gpu in snap.devices:
        data = gpu.to_dict()
        used_gpuq = snap.gpuq_memory.get(gpu.uuid, 0)
        used_foreign = snap.foreign_memory.get(gpu.uuid, 0)
        whole = any(
            j.gpu_mem_reserved is None
            for j in state.active.values()
            if j.state.is_active and gpu.uuid in j.gpu_uuids
        )
        if gpu.node in ("", state.config.daemon.node_name):
            outside = snap.foreign_pids.get(gpu.uuid, frozenset())
            data["processes"] = [
                {
                    **process,
                    "user": process_owner(int(process["pid"])),
                    "foreign": process["pid"] in outside,
                }
                for process in data["processes"]
            ]
        data.update(
            {
                "memory_gpuq": used_gpuq,
                "memory_foreign": used_foreign,
                "memory_reserved": reserved.get(gpu.uuid, 0),
                "memory_free": max(0, gpu.memory_total - gpu.memory_used),
                "jobs": sorted(jobs_on.get(gpu.uuid, [])),
                "mode": "whole" if whole else ("shared" if jobs_on.get(gpu.uuid) else "idle"),
            }
        )
        out.append(data)
    return {
        "gpus": out,
        "backend": state.node.gpu_backend,
        "sampled_at": snap.time,
        "servers": state.server_health(),
    }


def process_owner(pid: int) -> str | None:
    """The user running process `pid` on this server (its uid where it has no name), or None.

    So `gpuq gpus` says whose process outside gpuq holds a GPU.
    """
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
