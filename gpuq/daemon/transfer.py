"""A job's checkpoint follows it to the server it restarts on (the copy phase of a migration).

A job suspended to a checkpoint on one node and placed on another cannot
restart from a checkpoint it does not have there. `start` asks
`checkpoint_source` first; when the checkpoint is elsewhere, the job turns
`starting` on its new GPUs (so nobody else takes them) but keeps naming the
node that holds its checkpoint until the copy is done, and `begin` copies it:

1. the target prepares an empty ``checkpoints.incoming`` (`node.receive`,
   or `gpuq.daemon.incoming` here);
2. rsync copies the directory over gpuq's shared ssh connection (between
   two other servers, through a directory of this one), checking each file
   it moves against a whole-file checksum of what it read; meanwhile the
   source checks every checkpoint file against its own SHA-256 header
   (`node.check`, or `gpuq.ckptfile` here), so that check costs no time
   beyond the copy's where the two run on different machines;
3. once both are done, the target checks each file's header and length
   (`commit` with `checked`) and only then renames the directory into place;
4. the output the job wrote to gpuq's log directory on the source is
   copied beside it (`carry_outputs`), for the new attempt to append to;
5. the job names its new node, and its attempt launches there.

A copy that fails (a server down, a full disk, rsync cut off, a damaged
or missing file) replaces nothing: the job goes back to the queue, still
naming the node that holds its checkpoint, and is placed again after
`RETRY_SECONDS` (where its checkpoint is, or wherever a copy succeeds). A
head that dies mid-copy finds the job `starting` with no attempt on the
node it names, so recovery queues it again, and the copy runs anew.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq import ckptfile
from gpuq.cluster.ssh import prepare_ssh_dir, rsync_argv
from gpuq.daemon import faults, incoming, jobfiles
from gpuq.daemon.executor import lab_owner
from gpuq.daemon.identity import Account, UnknownAccount
from gpuq.daemon.outputs import (
    USERS_DIR,
    OutputError,
    log_name,
    open_for_reading,
    user_log_dir,
    write_carried,
)
from gpuq.daemon.state import DaemonState
from gpuq.errors import GpuqError, StateError
from gpuq.models import Job, JobState
from gpuq.units import format_size

log = logging.getLogger("gpuq.daemon")

RETRY_SECONDS = 30.0
"""How long a job whose checkpoint could not be copied waits before it is placed again."""


@dataclass(frozen=True, slots=True)
class Copied:
    """A finished copy: what arrived and how long it took."""

    files: int
    bytes: int
    seconds: float


def checkpoint_source(state: DaemonState, job: Job, node: str) -> str | None:
    """The node holding the checkpoint `job` restarts from, if that is not `node`.

    That is the node it suspended to a checkpoint on; else, for a job that
    ran on another server and lost it (or failed there), this one where it
    has a safety copy (`gpuq.daemon.safety`) to resume from.
    """
    if not job.attempts or not job.node or job.node == node:
        return None
    record = state.store.suspend_of(job.id, job.attempts)
    if record is not None and record.mode == "checkpoint" and record.completed is not None:
        return job.node
    here = state.node.name
    if node == here or incoming.safety_copy(state.node.job_dir(job.id)) is None:
        return None
    return here


def begin(state: DaemonState, job: Job, source: str, target: str, then: Callable[[], None]) -> None:
    """Copy the job's checkpoint from `source` to `target`, then call `then` (on the loop)."""
    attempt = job.attempts

    async def run() -> None:
        faults.crash_point("checkpoint-copying")
        try:
            copied = await copy(state, job.id, source, target)
        except GpuqError as exc:
            _failed(state, job.id, attempt, source, exc.message)
            return
        faults.crash_point("checkpoint-copied")
        carried = ""
        if _ran_on(state, job, source):
            carried = await carry_outputs(state, job, source, target)
        current = state.active.get(job.id)
        if current is None or current.attempts != attempt or current.state is not JobState.STARTING:
            return  # cancelled meanwhile
        speed = format_size(int(copied.bytes / copied.seconds)) if copied.seconds > 0 else "-"
        state.transition(
            current,
            JobState.STARTING,
            f"checkpoint copied from {source} to {target}: {format_size(copied.bytes)} "
            f"in {copied.seconds:.2f}s ({speed}/s), verified{carried}",
            node=target,
        )
        then()

    task = asyncio.get_running_loop().create_task(run())
    state.background.add(task)
    task.add_done_callback(state.background.discard)


def _ran_on(state: DaemonState, job: Job, source: str) -> bool:
    """True if the job's previous attempt ran on `source` (it suspended there to move)."""
    record = state.store.suspend_of(job.id, job.attempts - 1)
    return record is not None and record.mode == "checkpoint" and record.completed is not None


async def carry_outputs(state: DaemonState, job: Job, source: str, target: str) -> str:
    """Copy the job's output files in gpuq's log directories from `source` to `target`.

    The attempt on `target` appends to them, so `gpuq logs` there shows all
    the job wrote, as if it had never moved. Output the job sends to files
    of its own (`--output`, below its working directory) is left alone. A
    lab job's logs are its owner's alone, which the service account may not
    read, so the two daemons read and write them for it (`_carry_as_owner`);
    other jobs' go by rsync. A copy that fails only costs the earlier output
    there: "" when all went, else a note for the event saying what stays
    behind.
    """
    streams = ([] if job.spec.output else ["stdout"]) + (
        [] if job.spec.error or job.spec.output else ["stderr"]
    )
    if not streams:
        return ""
    owner = lab_owner(job.spec.uid)
    try:
        if owner is not None:
            for stream in streams:
                await _carry_as_owner(state, job.id, owner, stream, source, target)
        else:
            await _carry_by_rsync(state, job.id, streams, source, target)
    except GpuqError as exc:
        log.warning("job %d: its output stays on %s: %s", job.id, source, exc.message)
        return f"; its output so far stays on {source} ({exc.message})"
    return ""


CARRY_CHUNK = 512 * 1024
"""Bytes of a lab job's log per `node.read` or `node.output` (a request is at most 1 MiB)."""


async def _carry_by_rsync(
    state: DaemonState, job_id: int, streams: list[str], source: str, target: str
) -> None:
    """Copy the default logs with rsync (between two other servers, through this one)."""
    src_dir, dst_dir = _log_dir(state, source), _log_dir(state, target)
    both_remote = source in state.remotes and target in state.remotes
    hop = state.config.daemon.state_dir / "transfer" / f"{job_id}.logs"
    try:
        for stream in streams:
            name = log_name(job_id, stream)
            src = _at(state, source, src_dir / name)
            if both_remote:
                shutil.rmtree(hop, ignore_errors=True)
                hop.mkdir(parents=True, mode=0o700)
                await rsync(state, src, str(hop), one_file=True)
                src = str(hop / name)
            await rsync(state, src, _at(state, target, dst_dir), one_file=True)
    finally:
        shutil.rmtree(hop, ignore_errors=True)


async def _carry_as_owner(
    state: DaemonState, job_id: int, owner: int, stream: str, source: str, target: str
) -> None:
    """Copy a lab job's default log of `stream` part by part, read and written by the daemons.

    Each side's daemon (root) reads or writes the file in the owner's own
    log directory with the checks it applies to a job's output: the source
    reads only a regular file of the owner's, the target makes a new file of
    the owner's in place of whatever had its name. The first part, even an
    empty one, starts the target's file anew. StateError says what failed.
    """
    offset = 0
    while True:
        data = await _read_part(state, job_id, owner, stream, source, offset)
        await _write_part(state, job_id, owner, stream, target, offset, data)
        offset += len(data)
        if len(data) < CARRY_CHUNK:
            return


async def _read_part(
    state: DaemonState, job_id: int, owner: int, stream: str, node: str, offset: int
) -> bytes:
    """Up to `CARRY_CHUNK` bytes of the job's log on `node` from `offset`."""
    remote = state.remotes.get(node)
    if remote is not None:
        reply = await remote.request(
            "node.read", job=job_id, stream=stream, offset=offset, limit=CARRY_CHUNK, raw=True
        )
        return base64.b64decode(str(reply["data"]))
    path = state.config.daemon.log_dir / USERS_DIR / str(owner) / log_name(job_id, stream)

    def read() -> bytes:
        opened = open_for_reading(str(path), owner)
        if opened is None:
            return b""
        with opened as handle:
            handle.seek(offset)
            return handle.read(CARRY_CHUNK)

    try:
        return await asyncio.to_thread(read)
    except (OutputError, OSError) as exc:
        raise StateError(f"cannot read {path}: {exc}") from None


async def _write_part(
    state: DaemonState, job_id: int, owner: int, stream: str, node: str, offset: int, data: bytes
) -> None:
    """Write `data` at `offset` of the job's log on `node`, for its attempt there to append to."""
    remote = state.remotes.get(node)
    if remote is not None:
        await remote.request(
            "node.output",
            job=job_id,
            stream=stream,
            uid=owner,
            offset=offset,
            data=base64.b64encode(data).decode(),
        )
        return

    def write() -> None:
        account = Account.of_uid(owner)
        directory = user_log_dir(state.config.daemon.log_dir, owner, account.gid)
        write_carried(directory, log_name(job_id, stream), owner, account.gid, data, offset)

    try:
        await asyncio.to_thread(write)
    except (OutputError, UnknownAccount, OSError) as exc:
        raise StateError(f"cannot write the log of job {job_id} here: {exc}") from None


def _log_dir(state: DaemonState, node: str) -> Path:
    """The log directory for this head's jobs on `node`."""
    remote = state.remotes.get(node)
    return remote.log_dir if remote is not None else state.config.daemon.log_dir


def _at(state: DaemonState, node: str, path: Path) -> str:
    """`path` on `node` as rsync names it."""
    return f"{node}:{path}" if node in state.remotes else str(path)


def _failed(state: DaemonState, job_id: int, attempt: int, source: str, why: str) -> None:
    job = state.active.get(job_id)
    if job is None or job.attempts != attempt or job.state is not JobState.STARTING:
        return
    log.warning("job %d: its checkpoint could not be copied from %s: %s", job_id, source, why)
    state.transition(
        job,
        JobState.QUEUED,
        f"could not copy its checkpoint from {source}: {why}; placed again in {RETRY_SECONDS:.0f}s",
        attempts=max(0, job.attempts - 1),
        gpu_uuids=(),
        gpu_mem_reserved=None,
        node=source,
        retry_at=time.time() + RETRY_SECONDS,
    )


async def copy(state: DaemonState, job_id: int, source: str, target: str) -> Copied:
    """Copy the job's checkpoints from `source` to `target`, checked; GpuqError if not."""
    started = time.perf_counter()
    src_dir = state.node_named(source).job_dir(job_id) / jobfiles.CHECKPOINTS
    src = f"{source}:{src_dir}" if source in state.remotes else str(src_dir)
    remote_target = state.remotes.get(target)
    if remote_target is not None:
        prepared = await remote_target.request("node.receive", job=job_id, phase="prepare")
        dst = f"{target}:{prepared['path']}"
    else:
        dst = str(incoming.prepare(state.node.job_dir(job_id)))
    checking = asyncio.create_task(_check_source(state, job_id, source))
    try:
        if source in state.remotes and remote_target is not None:  # two hops, through here
            hop = state.config.daemon.state_dir / "transfer" / str(job_id)
            shutil.rmtree(hop, ignore_errors=True)
            hop.mkdir(parents=True, mode=0o700)
            try:
                await rsync(state, src, str(hop))
                await rsync(state, str(hop), dst)
            finally:
                shutil.rmtree(hop, ignore_errors=True)
        else:
            await rsync(state, src, dst)
    finally:
        problems = await checking  # never left running behind a failed copy
    if problems:
        raise StateError(
            f"the checkpoints on {source} are unsound: {'; '.join(problems)}",
            "nothing was replaced; the job is placed again where its checkpoint is",
        )
    if remote_target is not None:
        result: dict[str, Any] = await remote_target.request_apart(
            "node.receive", job=job_id, phase="commit", checked=True
        )
    else:
        job_dir = state.node.job_dir(job_id)
        result = await asyncio.to_thread(incoming.commit, job_dir, True)
    return Copied(int(result["files"]), int(result["bytes"]), time.perf_counter() - started)


async def _check_source(state: DaemonState, job_id: int, source: str) -> list[str]:
    """What is wrong with the job's checkpoint files on `source` (SHA-256 against headers)."""
    remote = state.remotes.get(source)
    if remote is None:
        directory = state.node.job_dir(job_id) / jobfiles.CHECKPOINTS
        return await asyncio.to_thread(ckptfile.verify_dir, directory)
    try:
        reply = await remote.request_apart("node.check", job=job_id)
    except GpuqError as exc:
        return [f"could not check them there: {exc.message}"]
    return [str(problem) for problem in reply.get("problems") or []]


async def rsync(state: DaemonState, source: str, target: str, one_file: bool = False) -> None:
    """Run rsync in a worker thread; StateError with its last words if it fails."""
    config = state.config
    argv = rsync_argv(source, target, config.cluster, config.daemon.runtime_dir, one_file)
    prepare_ssh_dir(config.daemon.runtime_dir)
    try:
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise StateError(
            "rsync is not installed here", "install rsync on every server (Debian: rsync)"
        ) from None
    if done.returncode != 0:
        raise StateError(
            f"rsync failed (exit {done.returncode}): {_first_cause(done.stderr)}",
            "check the disk space and the ssh connection of both servers",
        )


def _first_cause(stderr: str) -> str:
    """Rsync's words on what went wrong first: the receiver's, where it said any.

    Its last line is often the sender's echo of it ("Broken pipe"); the
    receiver's line names the cause ("No space left on device").
    """
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    receiver = [line for line in lines if line.startswith("rsync: [receiver]")]
    return (receiver or lines or ["no message"])[0]
