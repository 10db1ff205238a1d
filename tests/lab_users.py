"""Real users for the lab-mode tests: three users and an admin group, made with useradd.

`lab_users()` creates (once per machine, idempotently) the users
gpuq-alice, gpuq-bob and gpuq-carol, each with a home and a group of their
own, and the group gpuq-admins whose only member is gpuq-carol. It needs
root and the shadow utilities (useradd, groupadd, usermod); without them it
skips the test cleanly.

`service_account()` creates the account gpuq-svc in the same way, for the
lab daemons of other servers to log in as over ssh (with the password
field "*", so that sshd does not take it for a locked account).

`as_user(user, argv)` runs a command as that user the way a login would
(setpriv: uid, gid and the account's supplementary groups, HOME and USER
set, nothing of root's kept), so the CLI under test sees the daemon exactly
as another person would. For that the repository and its virtual
environment must be reachable by other users: `make_reachable` adds search
permission (o+x, never read) to each directory above them that lacks it.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

USERS = ("gpuq-alice", "gpuq-bob", "gpuq-carol")
ADMIN_GROUP = "gpuq-admins"
ADMIN = "gpuq-carol"
SERVICE_ACCOUNT = "gpuq-svc"
"""The account lab daemons of other servers log in as over ssh (`[lab] service_account`)."""
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class LabUser:
    """One test user: name, ids and home."""

    name: str
    uid: int
    gid: int
    home: str


def _run(argv: Sequence[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def require_root() -> None:
    """Skip unless root with the shadow utilities and setpriv."""
    if os.geteuid() != 0:
        pytest.skip("lab-mode tests create users: they need root")
    for tool in ("useradd", "groupadd", "usermod", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"lab-mode tests need {tool}")


def lab_users() -> dict[str, LabUser]:
    """The three test users (created on first use), by name."""
    require_root()
    try:
        grp.getgrnam(ADMIN_GROUP)
    except KeyError:
        _run(["groupadd", ADMIN_GROUP])
    users = {}
    for name in USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            _run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name])
            entry = pwd.getpwnam(name)
        users[name] = LabUser(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
    if ADMIN not in grp.getgrnam(ADMIN_GROUP).gr_mem:
        _run(["usermod", "--append", "--groups", ADMIN_GROUP, ADMIN])
    make_reachable(REPO)
    make_reachable(Path(sys.executable).resolve().parent)
    return users


def service_account() -> LabUser:
    """The lab's service account gpuq-svc (created on first use), able to log in by key.

    useradd leaves the password field "!" (locked), and OpenSSH without PAM
    refuses even a key login to a locked account; "*" means "no password"
    without locking it.
    """
    require_root()
    try:
        entry = pwd.getpwnam(SERVICE_ACCOUNT)
    except KeyError:
        _run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", SERVICE_ACCOUNT])
        entry = pwd.getpwnam(SERVICE_ACCOUNT)
    if _password_field(SERVICE_ACCOUNT) != "*":
        _run(["usermod", "--password", "*", SERVICE_ACCOUNT])
    make_reachable(REPO)
    make_reachable(Path(sys.executable).resolve().parent)
    return LabUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def _password_field(name: str) -> str | None:
    """`name`'s password field in /etc/shadow (None: no entry there)."""
    with open("/etc/shadow", encoding="utf-8") as shadow:
        for line in shadow:
            fields = line.rstrip("\n").split(":")
            if fields[0] == name and len(fields) > 1:
                return fields[1]
    return None


def make_reachable(path: Path) -> None:
    """Give other users search permission on `path` and every directory above it."""
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def shared_dir(prefix: str) -> Path:
    """A fresh directory every user can enter and write to (sticky, like /tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o1777)
    return path


def user_dir(base: Path, user: LabUser) -> Path:
    """A directory below `base` owned by `user`, private to them."""
    path = base / user.name
    path.mkdir(mode=0o700)
    os.chown(path, user.uid, user.gid)
    return path


def as_user(
    user: LabUser,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `user` (uid, gid, supplementary groups, HOME, USER), output captured."""
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": user.home,
        "USER": user.name,
        "LOGNAME": user.name,
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO),
        **(env or {}),
    }
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={user.uid}",
            f"--regid={user.gid}",
            "--init-groups",
            "--reset-env",
            "--",
            "env",
            *(f"{k}={v}" for k, v in environ.items()),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or user.home,
        check=False,
    )
