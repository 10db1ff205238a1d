"""One daemon for each state directory: the lock a daemon holds there, and who holds it.

The runtime directory's lock keeps two daemons off one socket. This one keeps
a daemon started with another runtime directory (a shell without
XDG_RUNTIME_DIR, such as cron's, falls back to /tmp/gpuq-<uid>) off the same
state: two daemons on one queue would run its jobs twice. The lock file
names its holder and the socket it listens on, so a daemon refused here, and
`gpuq doctor`, can say where to reach the one that runs.
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from gpuq.errors import DaemonUnavailable, StateError

LOCK_NAME = "gpuqd.lock"
"""The lock's name in the state directory, and of the runtime directory's lock by the socket."""
LISTENING = "listening"
"""Written after the pid in the runtime directory's lock once the daemon's socket is bound."""


@dataclass(frozen=True, slots=True)
class Holder:
    """The daemon that holds a state directory: its pid and its socket."""

    pid: int | None
    socket: Path | None


def take(state_dir: Path, runtime_dir: Path, socket: Path) -> int:
    """Lock `state_dir` for this process; the descriptor, to keep open while the daemon lives.

    Raises DaemonUnavailable, naming the holder and how to reach it, when
    another daemon holds it.
    """
    path = state_dir / LOCK_NAME
    try:
        fd = _open(path)
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise StateError(
                f"the state directory {state_dir} is on a read-only filesystem: "
                f"cannot make its lock {LOCK_NAME}",
                "remount it read-write, or set GPUQ_STATE_DIR to a writable directory",
            ) from None
        if exc.errno == errno.EACCES:
            raise StateError(
                f"cannot write the lock {path}: permission denied",
                "make the state directory and its files yours and writable, "
                "or set GPUQ_STATE_DIR to a directory of yours",
            ) from None
        raise StateError(
            f"cannot open the lock {path}: {exc.strerror}",
            "gpuq makes it a private file of yours: remove what is there (a link?) and start again",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _parse(os.read(fd, 4096))
        os.close(fd)
        raise in_use(state_dir, runtime_dir, holder) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket}\n".encode())
    except OSError:
        pass  # a full disk: the lock holds all the same, only its holder goes unnamed
    return fd


def _open(path: Path) -> int:
    """The lock's descriptor: read-write, or read-only where the file exists but cannot be written.

    A lock held on a read-only descriptor still keeps a second daemon out, and
    the store then says which file is read-only, rather than the lock.
    """
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES):
            raise
        try:
            return os.open(path, os.O_RDONLY | flags)
        except FileNotFoundError:
            raise exc from None


def holder(state_dir: Path) -> Holder | None:
    """The live daemon named by `state_dir`'s lock file, or None (none, or it has exited).

    Read without taking the lock, which a daemon starting at that moment
    would then find taken.
    """
    try:
        with open(state_dir / LOCK_NAME, "rb") as handle:
            found = _parse(handle.read(4096))
    except OSError:
        return None
    if found.pid is None:
        return None
    try:
        os.kill(found.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's: still the holder
    return found


def in_use(state_dir: Path, runtime_dir: Path, found: Holder) -> DaemonUnavailable:
    """The error for a state directory another daemon holds, with how to reach that one.

    A holder on this very runtime directory cannot be reached only because
    its socket is gone (a cleaner of /tmp removed it): that is what is said.
    """
    pid = "unknown" if found.pid is None else str(found.pid)
    socket = "unknown" if found.socket is None else str(found.socket)
    if found.socket is not None and _same_dir(found.socket.parent, runtime_dir):
        return DaemonUnavailable(
            f"gpuq daemon {pid} holds the state directory {state_dir}, but its socket "
            f"{socket} is gone (removed by a cleaner of {runtime_dir}?)",
            f"stop it (kill {pid}: its jobs keep running) and run the command again",
        )
    reach = (
        "set GPUQ_RUNTIME_DIR to its runtime directory to reach it"
        if found.socket is None
        else f"reach it with GPUQ_RUNTIME_DIR={found.socket.parent} gpuq ..."
    )
    return DaemonUnavailable(
        f"the state directory {state_dir} is in use by another gpuq daemon "
        f"(pid {pid}, socket {socket})",
        f"that daemon has another runtime directory than this shell's ({runtime_dir}, "
        f"set by XDG_RUNTIME_DIR or GPUQ_RUNTIME_DIR): {reach}",
    )


def _same_dir(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _parse(data: bytes) -> Holder:
    pid, _, socket = data.decode(errors="replace").strip().partition(" ")
    return Holder(int(pid) if pid.isdigit() else None, Path(socket) if socket else None)
