"""Files in a job's directory, shared by the daemon and the shim.

`<state>/jobs/<id>/` holds:

- `lock`: flocked by the job's shim for as long as it lives;
- `launch.json`: what to run (written by the daemon before the shim starts);
- `shim.json` / `child.json`: pid, start time and boot id of shim and job;
- `exit.json`: how the job ended (written by the shim, atomically);
- `checkpoints/`: kept across suspend and retry.

Every JSON file is written to a temporary name, fsynced and renamed, so a
reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Final

LOCK: Final = "lock"
LAUNCH: Final = "launch.json"
SHIM: Final = "shim.json"
CHILD: Final = "child.json"
EXIT: Final = "exit.json"
CHECKPOINTS: Final = "checkpoints"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically replace `path` with `data` as JSON (tmp, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(data).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None if absent or unreadable."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (/proc stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19])


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
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
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
