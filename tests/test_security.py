"""A second local user cannot read, steer or spoof another user's gpuq.

The test creates a real second user (root only; skipped otherwise) and acts
as that user in forked processes that drop to its uid. The victim is the
test's own user. What the second user tries:

1. squatting the runtime directory (created in advance, with a listening
   socket that logs what it receives), planting a symbolic link there, or
   listening on a socket the victim's client reaches: the victim's client
   sends nothing, the daemon refuses to start, and nothing is chmodded;
2. planting a symbolic link at a job's output path in a shared directory:
   the job fails with the reason, and the link's target is untouched;
3. naming a script so that its name carries terminal escapes: the victim's
   `gpuq ls` and `show` print them visibly, `--json` exactly.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuq.errors import ExitCode
from tests.daemon_harness import DaemonHarness, running_daemon, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="creating a second user needs root and useradd",
)

SECRET = "MY_SECRET_KEY"


@dataclass(frozen=True)
class User:
    """A local user the test created."""

    name: str
    uid: int
    gid: int


@pytest.fixture(scope="module")
def intruder() -> Iterator[User]:
    """A second real user, removed after the module's tests."""
    name = f"gpuqx{os.getpid() % 100_000}"
    created = subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if created.returncode != 0:
        pytest.skip(f"cannot create a user: {created.stderr.strip()}")
    entry = pwd.getpwnam(name)
    try:
        yield User(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def as_user(user: User, action: Callable[[], object]) -> int:
    """Run `action` in a forked process that runs as `user`; returns its exit status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            action()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - report, never return into pytest
            print(f"as {user.name}: {exc!r}", file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write in (like /tmp, but not sticky: no kernel protection)."""
    path = Path(tempfile.mkdtemp(prefix="gq-shared-", dir="/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Listener:
    """A socket another user listens on, in a forked process; records every byte it gets."""

    def __init__(self, user: User, path: Path, directory_mode: int | None = None) -> None:
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_end)
            code = 1
            try:
                os.setgroups([])
                os.setgid(user.gid)
                os.setuid(user.uid)
                if directory_mode is not None:
                    path.parent.mkdir(mode=directory_mode)
                    path.parent.chmod(directory_mode)
                self._serve(path, write_end)
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        self._read_end = read_end
        wait_for(path.exists, what=f"{user.name} to listen on {path}")

    @staticmethod
    def _serve(path: Path, report: int) -> None:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        os.chmod(path, 0o777)
        server.listen(16)
        while True:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    while data := conn.recv(65536):
                        os.write(report, data)

    def received(self) -> bytes:
        """Stop listening and return everything received."""
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        chunks = []
        while chunk := os.read(self._read_end, 65536):
            chunks.append(chunk)
        os.close(self._read_end)
        return b"".join(chunks)


def gpuq(runtime_dir: Path, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the victim's `gpuq` with this runtime directory and a state directory of its own."""
    env = {
        **os.environ,
        "GPUQ_RUNTIME_DIR": str(runtime_dir),
        "GPUQ_STATE_DIR": str(root / "state"),
        "GPUQ_CONFIG": str(root / "config.toml"),
        SECRET: "hunter2",
    }
    (root / "config.toml").write_text('[[gpus.fake]]\nname = "Fake"\nmemory = "8G"\ncount = 1\n')
    return subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=root,
    )


# -- 1: the runtime directory and the socket ------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o700])
def test_a_runtime_directory_created_by_another_user_gets_nothing(
    intruder: User, shared: Path, tmp_path: Path, mode: int
) -> None:
    runtime_dir = shared / f"gpuq-{os.getuid()}"
    listener = Listener(intruder, runtime_dir / "gpuq.sock", directory_mode=mode)
    submitted = gpuq(
        runtime_dir, tmp_path, "submit", "--", "true", f"--password={SECRET}", f"${SECRET}"
    )
    listed = gpuq(runtime_dir, tmp_path, "ls")
    assert listener.received() == b""
    for result in (submitted, listed):
        assert result.returncode == ExitCode.STATE, result.stderr
        assert f"belongs to uid {intruder.uid}, not to you" in result.stderr
        assert "hint: another user owns this directory" in result.stderr
        assert "Traceback" not in result.stderr


def test_a_listener_of_another_user_in_a_private_directory_gets_nothing(
    intruder: User, shared: Path, tmp_path: Path
) -> None:
    # The intruder listens in the shared directory; its socket is then moved into a
    # private directory of the victim's, as if it had won a race to bind there.
    listener = Listener(intruder, shared / "bait.sock")
    runtime_dir = Path(tempfile.mkdtemp(prefix="gq-", dir="/tmp"))
    try:
        (shared / "bait.sock").rename(runtime_dir / "gpuq.sock")
        result = gpuq(runtime_dir, tmp_path, "submit", "--", "true", f"--password={SECRET}")
        assert listener.received() == b""
        assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
        assert f"runs as uid {intruder.uid}, not as you" in result.stderr
        assert "nothing was sent to it" in result.stderr
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)


def test_the_daemon_refuses_a_runtime_directory_it_does_not_own(
    intruder: User, shared: Path, tmp_path: Path
) -> None:
    runtime_dir = shared / f"gpuq-{os.getuid()}"

    def squat() -> None:
        runtime_dir.mkdir()
        runtime_dir.chmod(0o777)

    assert as_user(intruder, squat) == 0
    result = gpuq(runtime_dir, tmp_path, "daemon", "run")
    assert result.returncode == ExitCode.STATE, result.stderr
    assert f"belongs to uid {intruder.uid}" in result.stderr
    assert "XDG_RUNTIME_DIR" in result.stderr
    assert runtime_dir.stat().st_uid == intruder.uid
    assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o777
    assert not (runtime_dir / "gpuq.sock").exists()


def test_a_planted_symlink_is_refused_and_never_chmodded_through(
    intruder: User, shared: Path, tmp_path: Path
) -> None:
    target = Path(tempfile.mkdtemp(prefix="gq-victim-", dir="/tmp"))
    try:
        target.chmod(0o755)
        runtime_dir = shared / f"gpuq-{os.getuid()}"
        assert as_user(intruder, lambda: runtime_dir.symlink_to(target)) == 0
        for args in (("daemon", "run"), ("ls",)):
            result = gpuq(runtime_dir, tmp_path, *args)
            assert result.returncode == ExitCode.STATE, result.stderr
            assert "is a symbolic link" in result.stderr
        assert stat.S_IMODE(target.stat().st_mode) == 0o755
        assert list(target.iterdir()) == []
    finally:
        shutil.rmtree(target, ignore_errors=True)


# -- 2: output files -------------------------------------------------------------------


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    with running_daemon(tmp_path) as harness:
        yield harness


def test_a_symlink_planted_at_the_output_path_is_not_followed(
    intruder: User, shared: Path, daemon: DaemonHarness
) -> None:
    secret = daemon.root / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    planted = shared / "out.log"
    assert as_user(intruder, lambda: planted.symlink_to(secret)) == 0
    job_id = daemon.submit(["echo", "appended"], gpus=0, output=str(planted))
    job = daemon.wait_state(job_id, "succeeded", "failed", "lost")
    assert job["state"] == "failed"
    assert "it is a symbolic link" in job["reason"]
    assert secret.read_text() == "root only\n"
    assert planted.is_symlink()


def test_a_file_planted_by_another_user_is_not_appended_to(
    intruder: User, shared: Path, daemon: DaemonHarness
) -> None:
    planted = shared / "out.log"
    assert as_user(intruder, lambda: planted.write_text("theirs\n")) == 0
    planted.chmod(0o666)
    job_id = daemon.submit(["echo", "mine"], gpus=0, output=str(planted))
    job = daemon.wait_state(job_id, "succeeded", "failed", "lost")
    assert job["state"] == "failed"
    assert f"belongs to uid {intruder.uid}" in job["reason"]
    assert planted.read_text() == "theirs\n"


# -- 3: text another user chose ----------------------------------------------------------


def test_a_script_named_with_terminal_escapes_is_shown_visibly(
    intruder: User, shared: Path, daemon: DaemonHarness
) -> None:
    hostile = "run\x1b]0;pwned\x07\x1b[2J\nID  forged.sh"
    script = shared / hostile

    def plant() -> None:
        script.write_text("#!/bin/sh\necho ran\n")
        script.chmod(0o755)

    assert as_user(intruder, plant) == 0
    result = daemon.cli("submit", "-q", "--gpus", "0", str(script))
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    daemon.wait_state(job_id, "succeeded")
    for args, visible in (
        (("ls", "-a"), "run\\x1b]0;pwned"),  # ls cuts names to 24 characters
        (("show", str(job_id)), "run\\x1b]0;pwned\\x07\\x1b[2J\\nID  forged.sh"),
    ):
        shown = daemon.cli(*args)
        assert shown.returncode == 0, shown.stderr
        assert not {"\x1b", "\x07"} & set(shown.stdout)
        assert visible in shown.stdout
    rows = daemon.cli("ls", "-a").stdout.splitlines()
    assert len(rows) == 2, rows
    exact = json.loads(daemon.cli("ls", "-a", "--json").stdout)["jobs"][0]["name"]
    assert exact == hostile


def test_the_daemon_answers_another_user_only_with_a_refusal(
    intruder: User, tmp_path: Path
) -> None:
    with running_daemon(tmp_path, extra_toml="socket_mode = 0o666") as daemon:
        daemon.runtime_dir.chmod(0o755)
        path = daemon.runtime_dir / "gpuq.sock"

        def knock() -> None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(10)
            conn.connect(str(path))
            # The daemon refuses at once, before reading: on a busy machine the
            # hello may find the connection closed, with the refusal already queued.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.sendall(b'{"id": 0, "method": "hello", "params": {"version": 1}}\n')
            reply = conn.recv(65536)
            if b"may not use this daemon" not in reply:
                raise AssertionError(reply)

        assert as_user(intruder, knock) == 0
        daemon.runtime_dir.chmod(0o700)  # the victim's own client accepts only a private one
        assert daemon.call("list")["jobs"] == []
