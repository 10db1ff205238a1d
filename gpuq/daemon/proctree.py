"""The processes of a job attempt, found in /proc, so that none outlives its job.

A job's command runs in its own session and process group, but its
descendants may leave both (`setsid sleep 600 &`). Two ways find them all:

- while the shim lives, it is a child subreaper, so every descendant stays
  in its process tree: `descendants(shim_pid)`;
- after the shim is gone (killed while the daemon was down), descendants
  were reparented elsewhere, but each still carries the attempt's
  environment: `attempt_members` matches `GPUQ_JOB_DIR` and `GPUQ_ATTEMPT`
  in /proc/PID/environ, and only for processes started no earlier than the
  attempt (a reused pid is a later process, and its environment differs).

A process that clears its own environment and leaves the tree of a dead
shim escapes; that is documented in docs/architecture.md. Standard library
only: the shim imports this module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")


@dataclass(frozen=True, slots=True)
class Proc:
    """One process as /proc/PID/stat describes it (times in clock ticks since boot)."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    starttime: int

    @property
    def alive(self) -> bool:
        """False for a zombie or a dead process: it holds nothing and runs nothing."""
        return self.state not in ("Z", "X", "x")


def read_proc(pid: int) -> Proc | None:
    """The process `pid`, or None if there is none."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0], int(fields[19]))


def table() -> dict[int, Proc]:
    """Every process on the machine, by pid."""
    procs: dict[int, Proc] = {}
    with os.scandir(PROC) as entries:
        for entry in entries:
            if entry.name.isdigit():
                proc = read_proc(int(entry.name))
                if proc is not None:
                    procs[proc.pid] = proc
    return procs


def descendants(root: int, procs: dict[int, Proc]) -> list[int]:
    """Pids of the live descendants of `root` (not `root` itself), parents first."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            if procs[child].alive:
                found.append(child)
            frontier.append(child)
    return found


def outside_group(pids: list[int], pgid: int, procs: dict[int, Proc]) -> list[int]:
    """The pids of `pids` not in process group `pgid` (a group signal already reached those)."""
    return [pid for pid in pids if pid in procs and procs[pid].pgid != pgid]


def attempt_members(
    job_dir: str, attempt: int, not_before: int, procs: dict[int, Proc]
) -> list[int]:
    """Live processes of one job attempt: its environment names it, and it is not older.

    `not_before` is a start time in clock ticks (the attempt's shim or
    command); processes that started earlier cannot belong to the attempt.
    """
    needles = (
        f"\0GPUQ_JOB_DIR={job_dir}\0".encode(),
        f"\0GPUQ_ATTEMPT={attempt}\0".encode(),
    )
    members = []
    for proc in procs.values():
        if not proc.alive or proc.starttime < not_before or proc.pid == os.getpid():
            continue
        try:
            environ = b"\0" + (PROC / str(proc.pid) / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if all(needle in environ for needle in needles):
            members.append(proc.pid)
    return members


def holding(path: Path, procs: dict[int, Proc]) -> list[int]:
    """Live process-group leaders (a shim leads its own) with a descriptor open on `path`.

    A job's lock shows who holds it only through the descriptors: the
    daemon that took the lock handed it over, and its pid is what
    /proc/locks names. Leaders only, so that a spawner passing the lock on
    (it leads no group) is never taken for the shim.
    """
    target = os.fsencode(os.path.realpath(path))
    found = []
    for proc in procs.values():
        if not proc.alive or proc.pgid != proc.pid or proc.pid == os.getpid():
            continue
        fds = PROC / str(proc.pid) / "fd"
        with contextlib.suppress(OSError):  # gone, or not ours to look into
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    if os.readlink(os.fsencode(fds / fd)) == target:
                        found.append(proc.pid)
                        break
    return found


def send(pids: Iterable[int], signum: int) -> int:
    """Send `signum` to each pid that still exists; returns how many were signalled."""
    sent = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            sent += 1
    return sent


def kill_until_gone(find: Callable[[], list[int]], timeout: float = 10.0) -> list[int]:
    """SIGKILL what `find` returns, again and again, until it finds nothing.

    Looking again catches a process forked while the others were being
    killed. Returns what was still found at the timeout (a process stuck in
    uninterruptible sleep), which the caller reports.
    """
    deadline = time.monotonic() + timeout
    while True:
        pids = find()
        if not pids or time.monotonic() > deadline:
            return pids
        send(pids, signal.SIGKILL)
        time.sleep(0.01)
