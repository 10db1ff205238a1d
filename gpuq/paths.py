"""Where gpuq keeps its files, and the checks that keep those places safe.

Defaults follow the XDG base directory spec: the config file in
`$XDG_CONFIG_HOME/gpuq/`, the state (database, job directories, logs) in
`$XDG_STATE_HOME/gpuq/`, the socket in `$XDG_RUNTIME_DIR/gpuq/`. The state
directory must be on a local filesystem, because SQLite's WAL mode is unsafe
over NFS and its kin; `filesystem_type` and `is_network_filesystem` let the
daemon detect that and refuse.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from gpuq.errors import StateError

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "afs",
        "9p",
    }
)
"""Filesystem types (as in /proc/self/mounts) that are shared over a network."""

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _xdg_dir(variable: str, fallback: str, environ: Mapping[str, str] | None) -> Path:
    """`$variable` if set to an absolute path (as the XDG spec requires), else ~/fallback."""
    value = (os.environ if environ is None else environ).get(variable, "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / fallback


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/gpuq/config.toml, else ~/.config/gpuq/config.toml."""
    return _xdg_dir("XDG_CONFIG_HOME", ".config", environ) / "gpuq" / "config.toml"


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_STATE_HOME/gpuq, else ~/.local/state/gpuq: the database, job dirs and logs."""
    return _xdg_dir("XDG_STATE_HOME", ".local/state", environ) / "gpuq"


def default_runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_RUNTIME_DIR/gpuq when that directory exists, else /tmp/gpuq-<uid>: the socket."""
    runtime = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "gpuq"
    return Path("/tmp") / f"gpuq-{os.getuid()}"


def _unescape_mount_field(field: str) -> str:
    r"""Decode the octal escapes the kernel writes in /proc/self/mounts (\040 is a space)."""
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def filesystem_type(path: Path, mounts_text: str | None = None) -> str | None:
    """The type ("ext4", "nfs4", ...) of the filesystem holding `path`, or None if unknown.

    Matches the longest mount point that contains the path (symlinks
    resolved; the path need not exist yet) in /proc/self/mounts, or in
    `mounts_text` when given. When a mount point appears twice, the later
    (upper) mount wins. None where /proc is unavailable (not Linux).
    """
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = _unescape_mount_field(fields[1])
        if not _contains(mount_point, target):
            continue
        if best is None or len(mount_point) >= best[0]:
            best = (len(mount_point), fields[2])
    return None if best is None else best[1]


def _contains(mount_point: str, target: str) -> bool:
    """True if `target` is `mount_point` or below it, comparing whole path components."""
    if mount_point == "/":
        return target.startswith("/")
    mount_point = mount_point.rstrip("/")
    return target == mount_point or target.startswith(mount_point + "/")


def is_network_filesystem(fstype: str) -> bool:
    """True for filesystems shared over a network (NFS, CIFS, Lustre, GPFS, FUSE, ...).

    Every FUSE filesystem ("fuse.sshfs", "fuse.glusterfs", ...) counts, since
    gpuq cannot tell a local one from a remote one and SQLite locking is
    unreliable on most of them.
    """
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")


def ensure_dir(path: Path) -> None:
    """Create `path` and its parents if missing (a directory others may read, such as logs).

    Raises `StateError` naming the directory and why when it cannot be made.
    """
    try:
        path.mkdir(mode=0o755, parents=True, exist_ok=True)  # never writable by others
    except OSError as exc:
        raise _cannot_create(path, exc) from None


def check_log_dir(path: Path) -> None:
    """Refuse a log directory another user owns or may write to (StateError).

    Jobs' default logs go there: in a directory of someone else's (an
    existing /tmp/gpuq-logs), or one anyone may write to, another user could
    read them, delete them or plant files in their place. A link to a
    directory of the daemon's user (or root's) is fine.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise StateError(f"cannot inspect the log directory {path}: {exc.strerror}") from None
    if info.st_uid not in (os.geteuid(), 0):
        raise StateError(
            f"the log directory {path} belongs to uid {info.st_uid}, not to the daemon's user "
            f"(uid {os.geteuid()}): its owner could read and delete the jobs' logs",
            "set daemon.log_dir in the gpuq config to a directory of your own",
        )
    if info.st_mode & stat.S_IWOTH:
        raise StateError(
            f"the log directory {path} has mode {stat.S_IMODE(info.st_mode):o}: anyone may "
            "write to it, and so delete the jobs' logs or plant files in their place",
            f"chmod o-w {path}, or set daemon.log_dir to another directory",
        )


def _cannot_create(path: Path, exc: OSError) -> StateError:
    """The error for a directory that could not be made, with what to do about it."""
    fix = (
        "its filesystem is read-only: remount it read-write"
        if exc.errno == errno.EROFS
        else "check the permissions of its parent"
    )
    return StateError(
        f"cannot create directory {path}: {exc.strerror}",
        f"{fix}, or choose another directory in the gpuq config",
    )


def ensure_private_dir(path: Path) -> None:
    """Create `path` (with parents) as a directory only its owner can use (mode 0700).

    An existing directory of ours with another mode (such as 0755) is reset
    to 0700, through a descriptor opened without following links, so a link
    planted in its place is never followed. Raises `StateError` if `path` is
    a symbolic link or not a directory, belongs to another user, or cannot
    be created.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        if not path.is_symlink():
            raise StateError(
                f"{path} exists and is not a directory",
                "move it away, or choose another directory in the gpuq config",
            ) from None
    except OSError as exc:
        raise _cannot_create(path, exc) from exc
    check_private_dir(path, fix_mode=True)


def check_private_dir(path: Path, *, fix_mode: bool = False) -> None:
    """Refuse `path` unless it is a real directory of this user that only this user can use.

    Symbolic links are refused, not followed (`lstat`). With `fix_mode`, a
    directory of ours that others may use is tightened to 0700; otherwise
    that is refused too. Raises `StateError` with a hint saying what to do.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise StateError(
            f"{path} does not exist", "gpuq creates it when the daemon starts"
        ) from None
    except OSError as exc:
        raise StateError(f"cannot inspect {path}: {exc.strerror}") from exc
    elsewhere = "(GPUQ_STATE_DIR, GPUQ_RUNTIME_DIR or the gpuq config)"
    if stat.S_ISLNK(info.st_mode):
        raise StateError(
            f"{path} is a symbolic link; gpuq never follows links for its private directories",
            f"someone else may have planted it: remove it (rm {path}) or choose another "
            f"directory {elsewhere}",
        )
    if not stat.S_ISDIR(info.st_mode):
        raise StateError(
            f"{path} is not a directory",
            "move it away, or choose another directory in the gpuq config",
        )
    if info.st_uid != os.getuid():
        raise StateError(
            f"{path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()})",
            "another user owns this directory and could read or answer your requests: "
            "have it removed (an administrator can, in /tmp), or set XDG_RUNTIME_DIR "
            f"(systemd sets it at login) or choose another directory {elsewhere}",
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077 == 0:
        return
    if not fix_mode:
        raise StateError(
            f"{path} has mode {mode:o}: other users may use it",
            f"chmod 700 {path} (gpuq makes its directories 0700)",
        )
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise StateError(f"{path} was replaced while gpuq checked it", "try again")
        os.fchmod(fd, 0o700)
    except OSError as exc:
        raise StateError(
            f"{path} has mode {mode:o} (other users may use it) and gpuq cannot "
            f"make it 0700: {exc.strerror}",
            f"chmod 700 {path}, or choose another directory {elsewhere}",
        ) from None
    finally:
        os.close(fd)


def require_socket_or_nothing(path: Path, then: str) -> bool:
    """True if a socket is at `path`, False if nothing is; StateError for anything else.

    Something else there (a directory, a file) would make the daemon fail to
    bind and the client fail to connect with an OS error nobody can act on;
    `then` ends the hint ("run the command again", "start the daemon again").
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(info.st_mode):
        kind = "directory" if stat.S_ISDIR(info.st_mode) else "file that is not a socket"
        raise StateError(
            f"{path} is a {kind}; the daemon's socket goes there",
            f"move it away (mv {path} {path}.old), then {then}",
        )
    return True
