"""A job's output files: opened without following links, and kept under a size limit.

The shim opens each output file with `O_NOFOLLOW`, so a symbolic link
planted at the path (in a shared directory, pointing at someone's file) is
refused, not followed; it appends only to a regular file of the job's user
or to a character device such as /dev/null. The directories on the way are
walked one at a time, and a link among them is followed only if nobody
else could have planted it (the kernel's `fs.protected_symlinks` rule,
whatever that setting says): in a directory others may write to, only the
job user's own links and the directory owner's. Missing directories are created
only where the launch record allows it (`create_below`: gpuq's own log
directory, or the job's working directory for a relative `--output`), one
level at a time.

In lab mode (the launch record's `run_as`) the shim opens the files at the
job's user's effective ids, so the kernel checks that user's permissions
on every directory and file; files it creates are private to the user
(0600), and its default log directory is one of the user's own
(`user_log_dir`). The daemon, as root, reads a job's output back only
through `open_for_reading`, which refuses links and other users' files.

`LogLimit` keeps each file under `[logs] max_size`: when one grows past it,
the shim keeps its first eighth and its last quarter, and puts a marker line
between them saying how much was dropped, so one chatty job cannot fill the
disk. Standard library only: the shim imports this module.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

USERS_DIR: Final = "users"
"""Subdirectory of the log directory holding each lab user's default logs (by uid)."""
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
    """Open the stdout and stderr files a launch record names.

    With `run_as` (lab mode) they must belong to that user, and new ones
    are made private to them (0600); the caller has switched to the user's
    effective ids, so the kernel checks the user's permissions.
    """
    below: dict[str, str] = launch.get("create_below") or {}
    run_as = launch.get("run_as")
    owner = None if run_as is None else int(run_as["uid"])
    mode = 0o644 if run_as is None else 0o600
    stdout = open_output(launch["stdout"], below.get(launch["stdout"]), owner=owner, mode=mode)
    if launch["stderr"] == launch["stdout"]:
        return Outputs(stdout, stdout)
    try:
        stderr = open_output(launch["stderr"], below.get(launch["stderr"]), owner=owner, mode=mode)
    except OutputError:
        os.close(stdout)
        raise
    return Outputs(stdout, stderr)


def open_output(
    path: str, create_below: str | None, *, owner: int | None = None, mode: int = 0o644
) -> int:
    """Open `path` for appending, never through a symbolic link; returns the descriptor.

    With `create_below`, missing directories between it and the file are
    created (mode 0755 less the umask); otherwise the directory must exist.
    An existing regular file must belong to `owner` (None: this process's
    effective user); a new one gets `mode` (less the umask).
    """
    parent, name = os.path.split(path)
    dir_fd = _open_directory(parent, create_below)
    try:
        fd = os.open(name, _FLAGS, mode, dir_fd=dir_fd)
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
        _check_target(fd, path, os.geteuid() if owner is None else owner)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_target(fd: int, path: str, owner: int) -> None:
    """Accept a regular file of the job's user (`owner`), or a character device (/dev/null)."""
    info = os.fstat(fd)
    if stat.S_ISCHR(info.st_mode):
        return
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"refusing to write the job's output to {path}: not a regular file")
    if info.st_uid != owner:
        raise OutputError(
            f"refusing to append the job's output to {path}: it belongs to uid {info.st_uid}, "
            f"not to the job's user (uid {owner})"
        )


_DIR_FLAGS: Final = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS: Final = 40
"""Links followed on one path at most, as the kernel's own limit (ELOOP beyond)."""


def _open_directory(parent: str, create_below: str | None) -> int:
    """A descriptor of `parent`, creating the missing levels below `create_below`.

    The path is walked a component at a time (`_walk`), so that a link
    another user planted in a directory anyone may write to (a shared
    working directory, /tmp) cannot send the output elsewhere.
    """
    relative = None
    if create_below is not None:
        relative = os.path.relpath(parent, create_below)
        if relative == os.curdir:
            relative = ""
        elif relative.split(os.sep)[0] == os.pardir:
            relative = None  # outside the allowed tree: create nothing
    if relative is None:
        return _walk(parent, create=False, shown=parent)
    assert create_below is not None
    fd = _walk(create_below, create=False, shown=create_below)
    try:
        return _walk(relative, create=True, shown=parent, start=fd)
    finally:
        os.close(fd)


def _walk(path: str, *, create: bool, shown: str, start: int = -1) -> int:
    """A descriptor (O_PATH) of the directory `path`, from `start` (default: / or the cwd).

    Each component is opened without following links; a link is followed
    only where a link may be trusted (`_check_link`), at most `_MAX_LINKS`
    of them. With `create`, missing components are made (0755 less the
    umask), as `mkdir -p` would. `shown` is the path the errors name.
    """
    parts = collections.deque(path.split(os.sep))
    begin = os.sep if path.startswith(os.sep) else os.curdir
    try:
        fd = os.open(begin, _DIR_FLAGS) if start < 0 else os.dup(start)
    except OSError as exc:
        raise OutputError(f"cannot use the directory {shown}: {exc.strerror}") from None
    links = 0
    try:
        while parts:
            part = parts.popleft()
            if part in ("", os.curdir):
                continue
            try:
                if create and part != os.pardir:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                target = _link_target(fd, part, exc, shown, create)
                links += 1
                if links > _MAX_LINKS:
                    raise OutputError(
                        f"cannot use the directory {shown}: too many levels of symbolic links"
                    ) from None
                parts.extendleft(reversed(target.split(os.sep)))
                if target.startswith(os.sep):
                    os.close(fd)
                    fd = -1
                    fd = os.open(os.sep, _DIR_FLAGS)
                continue
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def _link_target(dir_fd: int, name: str, error: OSError, shown: str, create: bool) -> str:
    """Where the link `name` in `dir_fd` points, if it may be followed; else OutputError."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        info = None
    if info is None or not stat.S_ISLNK(info.st_mode):
        if create:
            raise OutputError(
                f"cannot create the directory {shown} for the job's output: {error.strerror}"
            ) from None
        raise OutputError(
            f"cannot use the directory {shown} for the job's output: {error.strerror} "
            "(gpuq creates missing directories only below the job's working directory)"
        ) from None
    _check_link(dir_fd, name, info, shown)
    return os.readlink(name, dir_fd=dir_fd)


def _check_link(dir_fd: int, name: str, link: os.stat_result, shown: str) -> None:
    """Refuse a link another user made in a directory others may write to.

    The kernel's `fs.protected_symlinks` rule, applied whatever the
    setting (and to root, in lab mode, too): in such a directory a link is
    followed only if it is the job user's own or the directory owner's.
    """
    directory = os.fstat(dir_fd)
    if not directory.st_mode & stat.S_IWOTH or link.st_uid in (os.geteuid(), directory.st_uid):
        return
    raise OutputError(
        f"refusing to write the job's output to {shown}: {name} is a symbolic link that "
        f"uid {link.st_uid} made in a directory anyone may write to (gpuq follows such a link "
        "only if it is the job user's or the directory owner's; name the real directory)"
    )


class LogLimit:
    """Trim output files that grow past `max_bytes` (None or 0: no limit)."""

    def __init__(
        self, outputs: Outputs, max_bytes: int | None, setting: str = "[logs] max_size"
    ) -> None:
        self.outputs = outputs
        self.max_bytes = max_bytes or None
        self.setting = setting
        """What sets the limit, for the marker line."""
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
            f"this log is kept under {limit} bytes ({self.setting})]\n"
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


def user_log_dir(log_dir: Path, uid: int, gid: int) -> Path:
    """`<log_dir>/users/<uid>/`, made if missing: where a lab job's default logs go.

    The daemon (root) makes it, owned by the user and private to them
    (0700), so the shim, at the user's ids, can create the job's log there
    and nobody else can read it; `users/` itself stays root's, and others
    may only pass through it (0711). Each level is opened without following
    links and fixed through its descriptor. Raises OSError.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    log_dir.mkdir(parents=True, exist_ok=True)
    base = os.open(log_dir, flags & ~os.O_NOFOLLOW)  # the configured directory, as named
    try:
        users = _make_dir_at(base, USERS_DIR, flags)
    finally:
        os.close(base)
    try:
        _check_daemon_owns(users, log_dir / USERS_DIR)
        os.fchmod(users, 0o711)
        mine = _make_dir_at(users, str(uid), flags)
    finally:
        os.close(users)
    try:
        os.fchown(mine, uid, gid)
        os.fchmod(mine, 0o700)
    finally:
        os.close(mine)
    return log_dir / USERS_DIR / str(uid)


def log_name(job_id: int, stream: str) -> str:
    """The name of a job's default log of `stream` ("stdout" or "stderr") in a log directory."""
    return f"{job_id}.{'out' if stream == 'stdout' else 'err'}"


def default_logs(
    log_dir: Path, job_id: int, owner: int | None, output: str | None, error: str | None
) -> dict[str, Path]:
    """The logs gpuq names itself for a job, by stream: those without --output or --error.

    They lie in `log_dir`, or in its directory of `owner` (a lab job's uid).
    A job with only --output sends stderr there too, so it has none. The
    daemon places these logs (`gpuq.daemon.lifecycle.output_targets`), and
    they are the only ones `gpuq clean` deletes.
    """
    if owner is not None:
        log_dir = log_dir / USERS_DIR / str(owner)
    named = {}
    if not output:
        named["stdout"] = log_dir / log_name(job_id, "stdout")
    if not output and not error:
        named["stderr"] = log_dir / log_name(job_id, "stderr")
    return named


def write_carried(directory: Path, name: str, uid: int, gid: int, data: bytes, offset: int) -> int:
    """Write part of a moved job's earlier output to `directory/name`; the file's length after.

    A lab job's default log moves with it (`gpuq.daemon.transfer`): the
    daemon, as root, writes it into the user's own log directory, where the
    job's next attempt appends to it. At `offset` 0 whatever has the name
    goes (a log of an earlier stay here, or a link the user planted) and a
    new file is made, the user's and private to them (0600), so no link is
    ever followed and no file but this new one is written; a later part
    appends to it only while it is still that: a regular file of the user's
    with one link, `offset` bytes long. Raises OutputError.
    """
    path = directory / name
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise OutputError(f"cannot use the directory {directory}: {exc.strerror}") from None
    try:
        if offset == 0:
            fd = _fresh_file(dir_fd, name, path)
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o600)
            except BaseException:
                os.close(fd)
                raise
        else:
            try:
                fd = os.open(
                    name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                )
            except OSError as exc:
                raise OutputError(f"cannot append to {path}: {exc.strerror}") from None
            info = os.fstat(fd)
            if not (
                stat.S_ISREG(info.st_mode)
                and (info.st_uid, info.st_nlink, info.st_size) == (uid, 1, offset)
            ):
                os.close(fd)
                raise OutputError(f"{path} changed while the job's output was copied to it")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return os.fstat(fd).st_size
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _fresh_file(dir_fd: int, name: str, path: Path) -> int:
    """A new, empty file `name` in `dir_fd`, whatever had the name removed first."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OutputError(f"cannot replace {path}: {exc.strerror}") from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:  # EEXIST: something took the name between the two
        raise OutputError(f"cannot create {path}: {exc.strerror}") from None


def _check_daemon_owns(fd: int, path: Path) -> None:
    """Raise OSError (EPERM) unless the daemon's user owns the directory `fd` (at `path`)."""
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        raise OSError(errno.EPERM, f"it belongs to uid {owner}, not to the daemon", str(path))


def _make_dir_at(dir_fd: int, name: str, flags: int) -> int:
    """A descriptor of directory `name` in `dir_fd`, made (0700) if missing; never a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    return os.open(name, flags, dir_fd=dir_fd)


def open_for_reading(path: str, owner: int | None) -> BinaryIO | None:
    """Open a job's output file for the daemon to read back (`gpuq logs`).

    None when there is nothing to read: no such file, or a character device
    such as /dev/null. A symbolic link, anything but a regular file, or
    (with `owner`, the job's uid in lab mode) a file of another user is
    refused with `OutputError`: the daemon reads as root, and must not show
    one user a file that user could not read themselves.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(f"refusing to read {path}: it is a symbolic link") from None
        raise OutputError(f"cannot read {path}: {exc.strerror}") from None
    try:
        readable = _check_readable(fd, path, owner)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    if not readable:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _check_readable(fd: int, path: str, owner: int | None) -> bool:
    """True for a regular file of `owner`'s (None: anyone's), False for a character device."""
    info = os.fstat(fd)
    if stat.S_ISCHR(info.st_mode):
        return False
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"refusing to read {path}: not a regular file")
    if owner is not None and info.st_uid != owner:
        raise OutputError(
            f"refusing to read {path}: it belongs to uid {info.st_uid}, "
            f"not to the job's user (uid {owner})"
        )
    return True


def seek_to(handle: BinaryIO, offset: int) -> bool:
    """Move an output file to `offset`; False, without moving, when that is at or past its end.

    A reader asks for an offset past the end when it has read further before
    (the file was truncated) or simply a large one: nothing is there to read
    yet, as for the end itself. The kernel refuses to seek past the largest
    file the filesystem can hold (an offset of 2**62 is EINVAL), so the size
    is looked at first.
    """
    if offset >= os.fstat(handle.fileno()).st_size:
        return False
    handle.seek(offset)
    return True


def tail_offset(path: str | BinaryIO, lines: int) -> int:
    """Byte offset where the last `lines` lines of the file (a path or an open file) start."""
    if not isinstance(path, str):
        return _tail_offset(path, lines)
    with open(path, "rb") as handle:
        return _tail_offset(handle, lines)


def _tail_offset(handle: BinaryIO, lines: int) -> int:
    """`tail_offset` of an open file; leaves its position anywhere."""
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
