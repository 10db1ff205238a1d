"""logs: a job's output, optionally followed until the job ends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from gpuq.daemon.lifecycle import output_paths
from gpuq.daemon.node.gang import part_path
from gpuq.daemon.node.remote import RemoteNode
from gpuq.daemon.outputs import tail_offset
from gpuq.daemon.state import DaemonState
from gpuq.errors import UsageError
from gpuq.models import Job
from gpuq.protocol import Logs

CHUNK = 256 * 1024
POLL_SECONDS = 0.2


async def handle(
    state: DaemonState, request: Logs, emit: Callable[[dict[str, Any]], Awaitable[None]]
) -> dict[str, Any]:
    """Send the output as `{"data"}` events; the result says where it ended."""
    if request.stream not in ("stdout", "stderr"):
        raise UsageError(f"unknown stream {request.stream!r}", "use stdout or stderr")
    job = state.job(request.id)
    while request.follow and not job.stdout_path and not job.state.is_terminal:
        await asyncio.sleep(POLL_SECONDS)  # not started yet: where it runs decides where to read
        job = state.job(request.id)
    rank = _part(job, request.part)
    where = job.part_nodes[rank] if job.part_nodes else ""  # a multi-node job: that part's
    remote = state.remotes.get(where) if job.stdout_path else None
    if remote is not None:
        return await _remote(state, remote, request, emit)
    stdout, stderr = (
        (job.stdout_path, job.stderr_path) if job.stdout_path else output_paths(state, job)
    )
    path = part_path(stdout if request.stream == "stdout" else stderr, rank)
    offset = 0
    if request.tail is not None and os.path.exists(path):
        offset = tail_offset(path, request.tail)
    while True:
        if os.path.exists(path):
            with open(path, "rb") as handle:
                handle.seek(offset)
                while data := handle.read(CHUNK):
                    offset += len(data)
                    await emit({"data": data.decode(errors="replace")})
        job = state.job(request.id)
        if not request.follow or job.state.is_terminal:
            if request.follow and os.path.exists(path) and os.path.getsize(path) > offset:
                continue  # the last bytes written before the job ended
            break
        await asyncio.sleep(POLL_SECONDS)
    return {"path": path, "offset": offset, "state": job.state.value}


def _part(job: Job, part: int) -> int:
    """The rank whose output is asked for; UsageError if the job has no such part."""
    if part == 0:
        return 0
    count = len(job.part_nodes) if job.spec.multi_node else 1
    if not 0 <= part < count:
        what = f"{count} parts (0 to {count - 1})" if count > 1 else "one part (0)"
        raise UsageError(
            f"job {job.id} has {what}: there is no part {part}",
            "--part picks a part of a multi-node job (--nodes); leave it out for the first",
        )
    return part


async def _remote(
    state: DaemonState,
    remote: RemoteNode,
    request: Logs,
    emit: Callable[[dict[str, Any]], Awaitable[None]],
) -> dict[str, Any]:
    """The output of a job that ran on another server, read there (`node.read`)."""
    offset, tail, path = 0, request.tail, ""
    while True:
        job = state.job(request.id)  # looked at first: what it wrote before it ended is read
        while True:
            part = await remote.read_output(request.id, request.stream, offset, tail)
            tail, path = None, str(part.get("path") or path)
            offset = int(part["offset"])
            if part["data"]:
                await emit({"data": part["data"]})
            if offset >= int(part.get("size") or 0):
                break
        if not request.follow or job.state.is_terminal:
            break
        await asyncio.sleep(POLL_SECONDS)
    return {"path": path, "offset": offset, "state": job.state.value, "node": remote.name}
