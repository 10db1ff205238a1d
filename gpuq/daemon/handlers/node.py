"""node.*: what a head daemon on another server asks of this one (`gpuq.daemon.hosted`).

`node.launch` starts an attempt of the head's job, `node.signal` signals
one, `node.read` reads its output, `node.output` writes a moved lab job's
earlier output for its attempt here to append to, and `node.sync` reports
the head's attempts and this server's GPUs, waiting for a change when asked
(the head's long poll: a job's end reaches it at once, not at the next beat).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import os
import time
from typing import Any

from gpuq import ckptfile
from gpuq.control import parse_message
from gpuq.daemon import incoming, jobfiles
from gpuq.daemon.executor import LaunchSpec
from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.errors import ConflictError, UsageError
from gpuq.protocol import (
    NodeCheck,
    NodeControl,
    NodeDirs,
    NodeLaunch,
    NodeOutput,
    NodeRead,
    NodeReceive,
    NodeSignal,
    NodeSync,
)

SIGNAL_SETTLE = 5.0
"""Seconds a signal waits for a just-started attempt's command to have a process group."""


async def launch(state: DaemonState, request: NodeLaunch, caller: Caller) -> dict[str, Any]:
    """Start the attempt; the reply carries its shim's pid."""
    try:
        spec = hosted_as(LaunchSpec.from_dict(request.launch), caller)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"invalid launch of job {request.job}: {exc}") from None
    known = {gpu.uuid for gpu in state.gpus.devices}
    unknown = [uuid for uuid in request.gpus if uuid not in known]
    if unknown:
        raise UsageError(
            f"no GPU {', '.join(unknown)} on {state.config.daemon.node_name}",
            "the head's view of this server's GPUs is out of date; it will sync again",
        )
    pid = await state.hosted.launch(request.head, request.job, request.attempt, spec, request.gpus)
    state.wake.set()  # its GPUs are lent now: this daemon's own jobs go elsewhere
    return {"pid": pid, "version": state.hosted.version}


def hosted_as(spec: LaunchSpec, caller: Caller) -> LaunchSpec:
    """The launch as a root daemon may run it for another server: never as root for a user.

    The head names the job's owner (`run_as`); one it does not name, or
    root named by a caller who is not root, becomes the caller: the account
    the other server's bridge logged in as.
    """
    if os.geteuid() != 0 or caller.uid == 0:
        return spec
    if spec.run_as is None or spec.run_as.uid == 0:
        return dataclasses.replace(spec, run_as=caller.account)
    return spec


async def signal(state: DaemonState, request: NodeSignal) -> dict[str, Any]:
    """Signal the attempt; `delivered` is False when it is not that attempt or not running.

    An attempt whose shim runs but whose command has not started yet (no
    process group to signal) is tried again for up to `SIGNAL_SETTLE` seconds.
    """
    hosted = state.hosted
    deadline = time.monotonic() + SIGNAL_SETTLE
    while True:
        if hosted.signal(request.head, request.job, request.attempt, request.signal):
            return {"delivered": True}
        record = hosted.attempts.get((request.head, request.job))
        alive = record is not None and record.attempt == request.attempt and not record.outcome
        if not alive or time.monotonic() > deadline:
            return {"delivered": False}
        await asyncio.sleep(0.05)


async def sync(state: DaemonState, request: NodeSync) -> dict[str, Any]:
    """The head's attempts here, the live ones it no longer expects, and this server's GPUs."""
    expect: dict[int, int] = {}
    for key, attempt in request.expect.items():
        if not key.isdigit() or not isinstance(attempt, int) or isinstance(attempt, bool):
            raise UsageError("node.sync.expect maps job ids to attempt numbers")
        expect[int(key)] = attempt
    hosted = state.hosted
    hosted.paths(request.head)  # checks the head's name before anything waits
    if not hosted.new_dirs(request.head, request.dirs):  # a new directory is answered at once
        await hosted.wait_change(request.version, request.wait)
    acked = request.acked if request.outbox == hosted.outbox_id else -1
    reply = hosted.report(request.head, expect, acked)
    reply.update(hosted.paths(request.head))
    reply.update(
        {
            "node": state.config.daemon.node_name,
            "pid": os.getpid(),
            "backend": state.node.gpu_backend,
            "device_env": state.node.device_env(),
            "gpus": _gpus(state, request.head),
            "dirs_missing": [d for d in request.dirs if not os.path.isdir(d)],
        }
    )
    return reply


def _gpus(state: DaemonState, head: str) -> list[dict[str, Any]]:
    """This server's GPUs as the head should see them.

    Memory of the head's own attempts is `memory_head` (with their job ids
    in `jobs`); all other memory is foreign to it. `busy` marks a GPU the
    head must not place on: held by this daemon's own jobs or lent to
    another head.
    """
    owners = {pgid: key for pgid, key in state.hosted.pgids().items()}
    own = {uuid for job in state.active.values() if job.state.is_active for uuid in job.gpu_uuids}
    lent_elsewhere = {
        uuid
        for (owner, _), a in state.hosted.attempts.items()
        if owner != head and a.outcome is None
        for uuid in a.gpus
    }
    out = []
    for gpu in state.gpus.devices:
        mine = 0
        jobs: set[int] = set()
        for proc in gpu.processes:
            with contextlib.suppress(OSError):
                key = owners.get(os.getpgid(proc.pid))
                if key is not None and key[0] == head:
                    mine += proc.used_memory or 0
                    jobs.add(key[1])
        data = gpu.to_dict()
        data["processes"] = []
        data.update(
            {
                "memory_head": mine,
                "jobs": sorted(jobs),
                "busy": gpu.uuid in own or gpu.uuid in lent_elsewhere,
            }
        )
        out.append(data)
    return out


def control(state: DaemonState, request: NodeControl) -> dict[str, Any]:
    """Pass the message to the attempt's runner; `delivered` False if none is connected."""
    message = parse_message(request.message)
    delivered = state.hosted.control_send(request.head, request.job, request.attempt, message)
    return {"delivered": delivered}


async def receive(state: DaemonState, request: NodeReceive) -> dict[str, Any]:
    """Prepare for, or take in, the job's checkpoints copied from another server.

    The check reads every byte that arrived (SHA-256): it runs in a worker
    thread, so this daemon answers others meanwhile and the head's request
    gets its heartbeats, however large the checkpoint.
    """
    hosted = state.hosted
    record = hosted.attempts.get((request.head, request.job))
    if record is not None and record.outcome is None:
        raise ConflictError(
            f"job {request.job} of {request.head} runs here: its checkpoints cannot be replaced",
            "the head copies checkpoints only to a server the job is not running on",
        )
    job_dir = hosted.executor(request.head).jobs_dir / str(request.job)
    if request.phase == "prepare":
        # The job's output so far follows it into gpuq's log directory (`transfer.carry_outputs`).
        hosted.make_log_dir(request.head)
        return {"path": str(hosted.prepare_incoming(request.head, request.job))}
    if request.phase == "commit":
        return await asyncio.to_thread(incoming.commit, job_dir, request.checked)
    raise UsageError(f"unknown phase {request.phase!r}", "use prepare or commit")


async def check(state: DaemonState, request: NodeCheck) -> dict[str, Any]:
    """What is wrong with the job's checkpoint files here (SHA-256, in a worker thread)."""
    job_dir = state.hosted.executor(request.head).jobs_dir / str(request.job)
    problems = await asyncio.to_thread(ckptfile.verify_dir, job_dir / jobfiles.CHECKPOINTS)
    return {"problems": problems}


MAX_DIRS = 1000
"""The most directories one `node.dirs` request may name."""


def dirs(request: NodeDirs) -> dict[str, Any]:
    """The directories of `paths` that do not exist here."""
    if len(request.paths) > MAX_DIRS:
        raise UsageError(f"node.dirs names {len(request.paths)} paths", f"ask at most {MAX_DIRS}")
    return {"missing": [path for path in request.paths if not os.path.isdir(path)]}


def read(state: DaemonState, request: NodeRead) -> dict[str, Any]:
    """Part of a hosted attempt's output."""
    return state.hosted.read(
        request.head,
        request.job,
        request.stream,
        request.offset,
        request.limit,
        request.tail,
        request.raw,
    )


async def output(state: DaemonState, request: NodeOutput) -> dict[str, Any]:
    """Part of a moved lab job's earlier output, written here for its next attempt (a thread)."""
    try:
        data = base64.b64decode(request.data, validate=True)
    except binascii.Error:
        raise UsageError("node.output's data is not base64") from None
    if request.offset < 0:
        raise UsageError(f"node.output's offset is {request.offset}", "give 0 or more")
    size = await asyncio.to_thread(
        state.hosted.put_output,
        request.head,
        request.job,
        request.stream,
        request.uid,
        request.offset,
        data,
    )
    return {"size": size}
