"""A job's output files: opened without following links, and kept under a size limit.

The shim opens each output file with `O_NOFOLLOW`, so a symbolic link
planted at the path (in a shared directory, pointing at someone's file) is
refused, not followed; it appends only to a regular file of its own user or
to a character device such as /dev/null. Missing directories are created
only where the launch record allows it (`create_below`: gpuq's own log
directory, or the job's working directory for a relative `--output`), one
level at a time.

`LogLimit` keeps each file under `[logs] max_size`: when one grows past it,
the shim keeps its first eighth and its last quarter, and puts a marker line
between them saying how much was dropped, so one chatty job cannot fill the
disk. Standard library only: the shim imports this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from typing import Any, Final

CHECK_INTERVAL: Final = 1.0
"""Seconds between two checks of the output files' sizes."""
_CHUNK: Final = 1024 * 1024
_FLAGS: Final = (
    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
)


class OutputError(Exception):
    """An output file that must not or cannot be opened; the message says why."""


@dataclass(frozen=True, slots=True)
class Outputs:
    """The open output descriptors of a job (the same one twice when both go to one file)."""

    stdout: int
    stderr: int

    def fds(self) -> tuple[int, ...]:
        """Each distinct descriptor once."""
        return (self.stdout,) if self.stdout == self.stderr else (self.stdout, self.stderr)

    def close(self) -> None:
        """Close the descriptors (the job keeps its own copies)."""
        for fd in self.fds():
            with contextlib.suppress(OSError):
                os.close(fd)


def open_outputs(launch: dict[str, Any]) -> Outputs:
    """Open the stdout and stderr files a launch record names."""
    below: dict[str, str] = launch.get("create_below") or {}
    stdout = open_output(launch["stdout"], below.get(launch["stdout"]))
    if launch["stderr"] == launch["stdout"]:
        return Outputs(stdout, stdout)
    try:
        return Outputs(stdout, open_output(launch["stderr"], below.get(launch["stderr"])))
    except OutputError:
        os.close(stdout)
        raise


def open_output(path: str, create_below: str | None) -> int:
    """Open `path` for appending, never through a symbolic link; returns the descriptor.

    With `create_below`, missing directories between it and the file are
    created (mode 0755 less the umask); otherwise the directory must exist.
    """
    parent, name = os.path.split(path)
    dir_fd = _open_directory(parent, create_below)
    try:
        fd = os.open(name, _FLAGS, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(
                f"refusing to write the job's output to {path}: it is a symbolic link "
                "(gpuq never follows links for output files; remove it or name the target)"
            ) from None
        raise OutputError(f"cannot open the job's output file {path}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    try:
        _check_target(fd, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_target(fd: int, path: str) -> None:
    """Accept a regular file of this user's, or a character device (/dev/null)."""
    info = os.fstat(fd)
    if stat.S_ISCHR(info.st_mode):
        return
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"refusing to write the job's output to {path}: not a regular file")
    if info.st_uid != os.geteuid():
        raise OutputError(
            f"refusing to append the job's output to {path}: it belongs to uid {info.st_uid}, "
            f"not to the job's user (uid {os.geteuid()})"
        )


def _open_directory(parent: str, create_below: str | None) -> int:
    """A descriptor of `parent`, creating the missing levels below `create_below`."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    relative = None
    if create_below is not None:
        relative = os.path.relpath(parent, create_below)
        if relative == os.curdir:
            relative = ""
        elif relative.split(os.sep)[0] == os.pardir:
            relative = None  # outside the allowed tree: create nothing
    if relative is None:
        try:
            return os.open(parent, flags)
        except OSError as exc:
            raise OutputError(
                f"cannot use the directory {parent} for the job's output: {exc.strerror} "
                "(gpuq creates missing directories only below the job's working directory)"
            ) from None
    assert create_below is not None
    try:
        fd = os.open(create_below, flags)
    except OSError as exc:
        raise OutputError(f"cannot use the directory {create_below}: {exc.strerror}") from None
    for part in (p for p in relative.split(os.sep) if p):
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            next_fd = os.open(part, flags, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            raise OutputError(
                f"cannot create the directory {parent} for the job's output: {exc.strerror}"
            ) from None
        os.close(fd)
        fd = next_fd
    return fd


class LogLimit:
    """Trim output files that grow past `max_bytes` (None or 0: no limit)."""

    def __init__(self, outputs: Outputs, max_bytes: int | None) -> None:
        self.outputs = outputs
        self.max_bytes = max_bytes or None
        self.dropped: dict[int, int] = {}

    @property
    def interval(self) -> float | None:
        """How often `check` should run, or None when there is nothing to check."""
        return None if self.max_bytes is None else CHECK_INTERVAL

    def check(self) -> None:
        """Trim every output file that is over the limit (regular files only)."""
        if self.max_bytes is None:
            return
        for fd in self.outputs.fds():
            with contextlib.suppress(OSError):
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_size > self.max_bytes:
                    self._trim(fd, info.st_size, self.max_bytes)

    def _trim(self, fd: int, size: int, limit: int) -> None:
        """Keep the first eighth and the last quarter of the limit, with a marker between."""
        head, tail = limit // 8, limit // 4
        dropped = size - head - tail
        self.dropped[fd] = self.dropped.get(fd, 0) + dropped
        marker = (
            f"\n[gpuq: {dropped} bytes of output dropped here ({self.dropped[fd]} in all): "
            f"this log is kept under {limit} bytes ([logs] max_size)]\n"
        ).encode()
        # A second descriptor without O_APPEND, to the same file (never re-resolved by path).
        rw = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            source, target = size - tail, head + len(marker)
            os.pwrite(rw, marker, head)
            for offset in range(0, tail, _CHUNK):
                data = os.pread(rw, min(_CHUNK, tail - offset), source + offset)
                os.pwrite(rw, data, target + offset)
            os.ftruncate(rw, target + tail)
        finally:
            os.close(rw)


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
