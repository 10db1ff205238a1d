"""Files in a job's directory, shared by the daemon and the shim.

`<state>/jobs/<id>/` holds:

- `lock`: flocked by the job's shim for as long as it lives;
- `launch.json`: what to run (written by the daemon before the shim starts);
- `shim.json` / `child.json`: pid, start time and boot id of shim and job;
- `exit.json`: how the job ended (written by the shim, atomically);
- `checkpoints/`: kept across suspend and retry; in lab mode it belongs to
  the job's user (mode 0700), who reaches it through the daemon's
  directories by search permission only (`share_checkpoints`).

Every JSON file is written to a temporary name and renamed, so a reader sees
the old file or the new one, never half of one. The records a shim writes
are *reserved* by the daemon before the shim starts (`reserve`): their
temporary files are created full of spaces, which JSON ignores, and the shim
overwrites them in place. A shim can therefore record its start and its
job's exit even when the disk filled up while the job ran.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Final

from gpuq.daemon import proctree

LOCK: Final = "lock"
LAUNCH: Final = "launch.json"
SHIM: Final = "shim.json"
CHILD: Final = "child.json"
EXIT: Final = "exit.json"
CHECKPOINTS: Final = "checkpoints"


RESERVED_BYTES: Final = 16 * 1024
"""Room reserved for each record a shim writes (its reason text is capped to fit)."""
SHIM_RECORDS: Final = (SHIM, CHILD, EXIT)
"""The records a shim writes, each reserved by the daemon before the shim starts."""


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def write_json(path: Path, data: dict[str, Any], *, durable: bool = False) -> None:
    """Atomically replace `path` with `data` as JSON (tmp, rename; fsync if `durable`).

    A reserved temporary file (`reserve`) is overwritten in place, so the
    write needs no new disk space as long as the record fits.
    """
    tmp = _tmp(path)
    payload = json.dumps(data).encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        os.pwrite(fd, payload, 0)
        os.ftruncate(fd, len(payload))  # shrinking frees the rest of a reservation
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def reserve(job_dir: Path, names: tuple[str, ...] = SHIM_RECORDS) -> None:
    """Pre-create the temporary files of `names`, full of spaces, for `write_json` to fill.

    Raises OSError (ENOSPC) when the disk is already too full to start a job.
    """
    blank = b" " * RESERVED_BYTES
    for name in names:
        fd = os.open(
            _tmp(job_dir / name),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        try:
            os.write(fd, blank)
        finally:
            os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None if absent, unreadable or a symbolic link.

    Links are never followed: in lab mode a job's user writes records of
    their own (in `checkpoints/`) that the daemon, as root, reads.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def share_checkpoints(
    jobs_dir: Path, job_dir: Path, uid: int, gid: int, reader: int | None = None
) -> None:
    """Hand the job's `checkpoints/` to its user (lab mode), private to them (0700).

    The jobs directory and the job's own keep belonging to the daemon, and
    others may only pass through them (0711): the user reaches their
    checkpoints by path but can neither list nor change the daemon's
    records. With `reader` (the group of the lab's service account, on a
    server running another's jobs), that group may also read them (0750),
    so the head can copy them to another server. Each step below the jobs
    directory goes through a descriptor opened without following links.
    Raises OSError.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    for directory, nofollow in ((jobs_dir, 0), (job_dir, os.O_NOFOLLOW)):
        fd = os.open(directory, flags & ~os.O_NOFOLLOW | nofollow)
        try:
            os.fchmod(fd, 0o711)
        finally:
            os.close(fd)
    fd = os.open(job_dir / CHECKPOINTS, flags)
    try:
        os.fchown(fd, uid, gid if reader is None else reader)
        os.fchmod(fd, 0o700 if reader is None else 0o750)
    finally:
        os.close(fd)


def process_start_time(pid: int) -> int | None:
    """Start time of the live process `pid` in clock ticks since boot; None for a zombie."""
    proc = proctree.read_proc(pid)
    return proc.starttime if proc is not None and proc.alive else None


def boot_id() -> str:
    """This boot's random id, to tell a pid of this boot from an older one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def is_same_process(record: dict[str, Any] | None) -> bool:
    """True if the pid in `record` is alive and is the process recorded."""
    if not record or not isinstance(record.get("pid"), int):
        return False
    start = process_start_time(record["pid"])
    return start is not None and start == record.get("starttime")


def try_lock(path: Path) -> int | None:
    """Open and flock `path` exclusively without blocking.

    Returns the locked fd, or None if another process (a live shim) holds it.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_locked(path: Path) -> bool:
    """True if a live shim holds the job's lock."""
    if not path.exists():
        return False
    fd = try_lock(path)
    if fd is None:
        return True
    os.close(fd)
    return False


def launch_attempt(launch: dict[str, Any] | None) -> int | None:
    """The attempt a launch record is for (its `GPUQ_ATTEMPT`), or None without one."""
    env = None if launch is None else launch.get("env")
    value = env.get("GPUQ_ATTEMPT") if isinstance(env, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() else None
