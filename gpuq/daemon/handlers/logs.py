"""logs: a job's output, optionally followed until the job ends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from gpuq.daemon.lifecycle import output_paths
from gpuq.daemon.state import DaemonState
from gpuq.errors import UsageError
from gpuq.protocol import Logs

CHUNK = 256 * 1024
POLL_SECONDS = 0.2


def tail_offset(path: str, lines: int) -> int:
    """Byte offset where the last `lines` lines of the file start."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        end = pos = handle.tell()
        if lines <= 0:
            return end
        found = 0
        while pos > 0 and found <= lines:
            step = min(8192, pos)
            pos -= step
            handle.seek(pos)
            block = handle.read(step)
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 10 and pos + i != end - 1:
                    found += 1
                    if found == lines:
                        return pos + i + 1
    return 0


async def handle(
    state: DaemonState, request: Logs, emit: Callable[[dict[str, Any]], Awaitable[None]]
) -> dict[str, Any]:
    """Send the output as `{"data"}` events; the result says where it ended."""
    if request.stream not in ("stdout", "stderr"):
        raise UsageError(f"unknown stream {request.stream!r}", "use stdout or stderr")
    job = state.job(request.id)
    stdout, stderr = (
        (job.stdout_path, job.stderr_path) if job.stdout_path else output_paths(state, job)
    )
    path = stdout if request.stream == "stdout" else stderr
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
