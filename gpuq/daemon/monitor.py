"""GPU sampling: who holds memory on each GPU, gpuq's jobs or someone else.

Each sample asks the node (`gpuq.daemon.node`) for its GPUs, telling it
first which jobs hold which (fake GPUs show them as NVML would; NVML sees
them itself), then attributes every GPU
process to a gpuq job by its process group (a job's processes all live in
the group its shim created) and counts the rest as foreign: memory the
scheduler must leave alone. It also keeps each
job's memory peak, which `--gpu-mem auto` learns from, and credits each
GPU's utilization to the job computing on it alone (`scheduler.introspect`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from gpuq.daemon import jobfiles, suspend
from gpuq.daemon.node.remote import RemoteNode
from gpuq.daemon.scheduler.introspect import COMPUTING
from gpuq.daemon.scheduler.slicer import PARK_RESIDENT_BYTES
from gpuq.daemon.state import DaemonState, GpuSnapshot
from gpuq.gpus import JobHolding
from gpuq.models import GpuInfo, Job, JobState


def _local(state: DaemonState, job: Job) -> bool:
    """True for a job whose attempt runs on this server (not on another over ssh)."""
    return job.node not in state.remotes


def job_pgids(state: DaemonState) -> dict[int, int]:
    """Process group id -> job id, for every job here that may hold a GPU."""
    for job in state.active.values():
        if not _local(state, job):
            continue
        if job.state.is_active and job.gpu_uuids and job.id not in state.child_pgids:
            record = state.node.read_record(job.id, jobfiles.CHILD)
            if jobfiles.is_same_process(record):
                assert record is not None
                state.child_pgids[job.id] = int(record["pgid"])
    return {pgid: job_id for job_id, pgid in state.child_pgids.items()}


def holdings(state: DaemonState) -> dict[int, JobHolding]:
    """What each running job holds: its live process group, its GPUs, whether it computes.

    A job parked for another's turn keeps only its CUDA context on its GPUs
    (`PARK_RESIDENT_BYTES`, at most its reservation); one stopped keeps all.
    """
    held = {}
    for job in state.active.values():
        if not _local(state, job):
            continue
        pgid = state.child_pgids.get(job.id)
        if not job.state.is_active or not job.gpu_uuids or pgid is None or not _exists(pgid):
            continue
        memory = job.gpu_mem_reserved or 0
        computing = job.state in COMPUTING
        if job.state is JobState.SUSPENDED and suspend.mode_of(state, job) == "park":
            memory = min(memory, PARK_RESIDENT_BYTES)
        held[job.id] = JobHolding(pgid, job.gpu_uuids, memory, computing)
    return held


def _exists(pid: int) -> bool:
    try:
        os.getpgid(pid)
    except OSError:
        return False
    return True


def split_memory(
    devices: list[GpuInfo], pgid_to_job: dict[int, int]
) -> tuple[GpuSnapshot, dict[int, int]]:
    """Split each GPU's process memory into gpuq jobs' and foreign.

    Also returns each job's largest per-GPU use in this sample.
    """
    snap = GpuSnapshot(devices=devices, time=time.time())
    per_job: dict[int, int] = {}
    for gpu in devices:
        gpuq = foreign = 0
        jobs: list[int] = []
        outside: set[int] = set()
        for proc in gpu.processes:
            used = proc.used_memory or 0
            job_id = None
            with contextlib.suppress(OSError):
                job_id = pgid_to_job.get(os.getpgid(proc.pid))
            if job_id is None:
                foreign += used
                outside.add(proc.pid)
            else:
                gpuq += used
                jobs.append(job_id)
                per_job[job_id] = max(per_job.get(job_id, 0), used)
        snap.gpuq_memory[gpu.uuid] = gpuq
        snap.foreign_memory[gpu.uuid] = foreign
        snap.foreign_pids[gpu.uuid] = frozenset(outside)
        snap.jobs_on_gpu[gpu.uuid] = sorted(set(jobs))
    return snap, per_job


async def sample_once(state: DaemonState) -> None:
    """Take one sample from the node (off the event loop: NVML calls block) and publish it."""
    pgids = job_pgids(state)
    devices = await state.node.sample_gpus({**holdings(state), **state.hosted.holdings()})
    snap, per_job = split_memory(devices, pgids)
    for remote in state.remotes.values():
        add_remote(snap, remote)
    for job_id, used in per_job.items():
        state.memory_peaks[job_id] = max(state.memory_peaks.get(job_id, 0), used)
    foreign_changed = snap.foreign_memory != state.gpus.foreign_memory
    state.gpus = snap
    state.introspection.note_utilization(snap, state.active.values(), state.memory_peaks)
    if foreign_changed:
        state.wake.set()
    state.publish({"type": "gpus", "gpus": [g.to_dict() for g in snap.devices], "time": snap.time})


def add_remote(snap: GpuSnapshot, remote: RemoteNode) -> None:
    """Add another server's GPUs as it last reported them (none while it is down).

    Memory of this head's jobs there is gpuq's; the rest is foreign, and a
    GPU the server's own jobs or another head's hold is foreign whole.
    """
    mirror = remote.mirror
    if mirror is None:
        return
    for gpu in mirror.devices:
        snap.devices.append(gpu)
        ours = mirror.memory_head.get(gpu.uuid, 0)
        snap.gpuq_memory[gpu.uuid] = ours
        foreign = max(0, gpu.memory_used - ours)
        snap.foreign_memory[gpu.uuid] = gpu.memory_total if gpu.uuid in mirror.busy else foreign
        snap.jobs_on_gpu[gpu.uuid] = sorted(mirror.jobs_on_gpu.get(gpu.uuid, []))


async def run_monitor(state: DaemonState, interval: float = 1.0) -> None:
    """Sample every `interval` seconds until the daemon stops."""
    while not state.should_exit.is_set():
        await sample_once(state)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.should_exit.wait(), timeout=interval)
