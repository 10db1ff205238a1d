"""logs: a job's output, optionally followed until the job ends."""

from __future__ import annotations

import asyncio
import base64
import codecs
import os
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from gpuq.daemon.access import require_owner
from gpuq.daemon.executor import lab_owner
from gpuq.daemon.identity import Caller
from gpuq.daemon.lifecycle import output_paths
from gpuq.daemon.node.gang import part_path
from gpuq.daemon.node.remote import RemoteNode
from gpuq.daemon.outputs import OutputError, open_for_reading, seek_to, tail_offset
from gpuq.daemon.state import DaemonState
from gpuq.errors import GpuqError, PermissionDenied, UsageError
from gpuq.models import Job
from gpuq.protocol import Logs

CHUNK = 256 * 1024
POLL_SECONDS = 0.2


async def handle(
    state: DaemonState,
    request: Logs,
    emit: Callable[[dict[str, Any]], Awaitable[None]],
    caller: Caller,
) -> dict[str, Any]:
    """Send the output as `{"data"}` events; the result says where it ended."""
    if request.stream not in ("stdout", "stderr"):
        raise UsageError(f"unknown stream {request.stream!r}", "use stdout or stderr")
    if request.tail is not None and request.tail < 0:
        raise UsageError(
            f"logs.tail must be 0 or more, got {request.tail}", "--tail N: the last N lines"
        )
    if request.offset is not None and request.offset < 0:
        raise UsageError(
            f"logs.offset must be 0 or more, got {request.offset}",
            "the offset of the last event received",
        )
    job = state.job(request.id)
    require_owner(state.config, caller, job, "read the logs of")
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
    owner = lab_owner(job.spec.uid) if state.config.lab.enabled else None
    offset = request.offset or 0
    if request.offset is None and request.tail is not None:
        if (first := _open_log(path, owner)) is not None:
            with first:
                offset = tail_offset(first, request.tail)
    text = _decoder()
    while True:
        if (handle := _open_log(path, owner)) is not None:
            with handle:
                if seek_to(handle, offset):  # past the end: nothing there yet
                    while data := handle.read(CHUNK):
                        offset += len(data)
                        await _send(emit, text.decode(data), offset, text)
        job = state.job(request.id)
        if not request.follow or job.state.is_terminal:
            if request.follow and os.path.exists(path) and os.path.getsize(path) > offset:
                continue  # the last bytes written before the job ended
            break
        await asyncio.sleep(POLL_SECONDS)
    await _send(emit, text.decode(b"", final=True), offset, text)
    # A lab daemon is root: it says nothing of paths its user may not see for themselves.
    if owner is None and job.stdout_path and job.state.is_terminal and not os.path.lexists(path):
        raise GpuqError(
            f"job {job.id}'s {request.stream} is gone: {path} does not exist",
            "it was deleted after the job ran, or the job ended before its output was opened "
            f"(gpuq show {job.id} says how it ended)",
        )
    return {"path": path, "offset": offset, "state": job.state.value}


def _decoder() -> codecs.IncrementalDecoder:
    """UTF-8 decoding across reads: a character split between two reads is sent whole.

    A read ends wherever the file (or the chunk) does, often inside a
    character (tqdm's bars are three bytes each); decoding each read alone
    would turn such a character into replacement characters. Bytes that are
    not UTF-8 at all still become U+FFFD: the events carry text.
    """
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


async def _send(
    emit: Callable[[dict[str, Any]], Awaitable[None]],
    text: str,
    offset: int,
    decoder: codecs.IncrementalDecoder,
) -> None:
    """One `{"data", "offset"}` event: the offset is of the bytes sent, not of a half character."""
    if text:
        pending = len(decoder.getstate()[0])
        await emit({"data": text, "offset": offset - pending})


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
    offset, path = request.offset or 0, ""
    tail = request.tail if request.offset is None else None
    text = _decoder()
    while True:
        job = state.job(request.id)  # looked at first: what it wrote before it ended is read
        while True:
            part = await remote.read_output(request.id, request.stream, offset, tail)
            tail, path = None, str(part.get("path") or path)
            offset = int(part["offset"])
            await _send(emit, text.decode(base64.b64decode(part["data"])), offset, text)
            if offset >= int(part.get("size") or 0):
                break
        if not request.follow or job.state.is_terminal:
            break
        await asyncio.sleep(POLL_SECONDS)
    await _send(emit, text.decode(b"", final=True), offset, text)
    return {"path": path, "offset": offset, "state": job.state.value, "node": remote.name}


def _open_log(path: str, owner: int | None) -> BinaryIO | None:
    """A job's output opened for reading (`outputs.open_for_reading`); None: nothing to read.

    The daemon may read as root: a link, a FIFO, or (on a lab daemon) a file
    not of the job's user is refused, so nobody reads through a job's
    `--output` what they could not read themselves.
    """
    try:
        return open_for_reading(path, owner)
    except OutputError as exc:
        raise PermissionDenied(str(exc), "a job's output is read only from its own files") from None
