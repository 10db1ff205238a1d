"""The state directory: deleted under the daemon, read-only, and ids that are never reused.

A state directory deleted while the daemon runs is noticed within a second:
the daemon stops accepting work with a clear error, `gpuq ls` and `doctor`
say why, and a restart starts afresh with ids above every id handed out
before. A read-only database stops the daemon at its start with a clear
error, not an internal one at the first submit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.daemon.statedir import LAST_ID, id_floor
from gpuq.errors import ExitCode
from tests.daemon_harness import DaemonHarness, mounted_tmpfs, running_daemon, wait_for


def test_a_deleted_state_directory_stops_new_work_with_a_clear_error(
    daemon: DaemonHarness,
) -> None:
    first = daemon.submit(["true"], gpus=0)
    daemon.wait_state(first, "succeeded")
    shutil.rmtree(daemon.state_dir)

    def refused() -> str | None:
        result = daemon.cli("submit", "--gpus", "0", "--", "true")
        return result.stderr if result.returncode == ExitCode.STATE else None

    error = wait_for(refused, what="the daemon to notice")
    assert f"the state directory {daemon.state_dir} was deleted while the daemon ran" in error
    assert "hint: gpuq daemon restart starts afresh" in error
    listing = daemon.cli("ls")
    assert listing.returncode == 0
    assert "gpuq: warning: the state directory" in listing.stderr
    status = json.loads(daemon.cli("daemon", "status", "--json").stdout)
    assert any("was deleted" in warning for warning in status["warnings"])
    doctor = daemon.cli("doctor")
    assert doctor.returncode == 1
    assert "[FAIL] daemon: running" in doctor.stdout
    assert "was deleted" in doctor.stdout


def test_after_the_state_directory_is_deleted_a_restart_never_reuses_an_id(
    daemon: DaemonHarness,
) -> None:
    ids = [daemon.submit(["true"], gpus=0) for _ in range(3)]
    array = daemon.call("submit", spec=spec_of(daemon), array=[0, 1])
    last = max(ids[-1], *array["ids"])
    daemon.wait_state(array["ids"][-1], "succeeded")
    daemon.stop()
    shutil.rmtree(daemon.state_dir)
    daemon.start()
    assert daemon.submit(["true"], gpus=0) == last + 1


def test_the_id_floor_comes_from_the_runtime_directory_and_the_job_directories(
    tmp_path: Path,
) -> None:
    runtime, jobs = tmp_path / "run", tmp_path / "jobs"
    assert id_floor(runtime, jobs) == 0
    (jobs / "17").mkdir(parents=True)
    (jobs / "not-an-id").mkdir()
    assert id_floor(runtime, jobs) == 17
    runtime.mkdir()
    (runtime / LAST_ID).write_text("41\n")
    assert id_floor(runtime, jobs) == 41


def spec_of(daemon: DaemonHarness) -> dict[str, object]:
    return {"command": ["true"], "cwd": str(daemon.root), "env": dict(os.environ), "gpus": 0}


@pytest.fixture
def read_only_state(tmp_path: Path) -> Iterator[DaemonHarness]:
    """A daemon whose state directory became read-only after its database was made."""
    harness = DaemonHarness(tmp_path)
    mounted = None
    if os.geteuid() == 0:  # root writes through file modes: make the filesystem read-only
        mounted = harness.state_dir
        mounted.mkdir(parents=True)
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mounted)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mount.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        harness.start()
        harness.stop()
        if mounted is not None:
            subprocess.run(["mount", "-o", "remount,ro", str(mounted)], check=True)
        else:
            for path in (harness.state_dir / "gpuq.db", harness.state_dir):
                path.chmod(0o555)
        yield harness
    finally:
        harness.close()
        if mounted is not None:
            subprocess.run(["umount", "-l", str(mounted)], check=False)
        else:
            harness.state_dir.chmod(0o700)


def test_a_read_only_database_is_refused_at_start_with_a_clear_error(
    read_only_state: DaemonHarness,
) -> None:
    result = read_only_state.cli("daemon", "run")
    assert result.returncode == ExitCode.STATE, result.stderr
    assert "gpuq.db is read-only" in result.stderr
    assert "internal error" not in result.stderr
    assert "hint: make it and its directory writable" in result.stderr


def test_a_daemon_a_command_starts_fails_with_its_own_error_code_not_unreachable(
    tmp_path: Path,
) -> None:
    """A script tells an unusable state directory (exit 7) from a daemon that is not there (5)."""
    harness = DaemonHarness(tmp_path)
    harness.state_dir.mkdir(parents=True, mode=0o700)
    (harness.state_dir / "gpuq.db").write_bytes(b"not a database, " * 64)
    try:
        result = harness.cli("ls", "--json")
    finally:
        harness.close()
    assert result.returncode == ExitCode.STATE, result.stderr
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "state"
    assert error["message"] == (
        "the gpuq daemon could not start: cannot open the state database "
        f"{harness.state_dir / 'gpuq.db'}: file is not a database"
    )
    assert error["hint"] == (
        "check the state directory (gpuq doctor); move a corrupt file aside to start afresh"
    )


def test_a_read_only_state_directory_is_a_state_error_for_a_command_that_starts_the_daemon(
    read_only_state: DaemonHarness,
) -> None:
    result = read_only_state.cli("ls")
    assert result.returncode == ExitCode.STATE, result.stderr
    assert "read-only" in result.stderr.lower()
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("mode", "error", "hint"),
    [
        (
            "700",
            "/logs: Read-only file system",
            "its filesystem is read-only: remount it read-write",
        ),
        (
            "1777",
            " has mode 1777 (other users may use it) and gpuq cannot make it 0700",
            "chmod 700",
        ),
    ],
)
def test_a_read_only_state_directory_without_a_database_is_refused_with_a_clear_error(
    tmp_path: Path, mode: str, error: str, hint: str
) -> None:
    harness = DaemonHarness(tmp_path)
    with mounted_tmpfs(harness.state_dir, f"ro,size=1m,mode={mode}"):
        try:
            result = harness.cli("daemon", "run")
        finally:
            harness.close()
    assert result.returncode == ExitCode.STATE, result.stderr
    assert "internal error" not in result.stderr
    assert "Traceback" not in result.stderr
    assert f"{harness.state_dir}{error}" in result.stderr
    assert f"hint: {hint}" in result.stderr


@pytest.mark.parametrize(
    ("mode", "owner", "error"),
    [
        (0o1777, None, "has mode 1777: anyone may write to it"),
        (0o755, 54321, "belongs to uid 54321, not to the daemon's user"),
    ],
    ids=["anyone-may-write", "another-users"],
)
def test_a_log_directory_others_could_tamper_with_is_refused_at_start(
    tmp_path: Path, mode: int, owner: int | None, error: str
) -> None:
    """A `log_dir = "/tmp/gpuq-logs"` that someone else made first must not get the logs."""
    if owner is not None and os.geteuid() != 0:
        pytest.skip("giving a directory to another uid needs root")
    logs = tmp_path / "shared-logs"
    logs.mkdir()
    logs.chmod(mode)
    if owner is not None:
        os.chown(logs, owner, owner)
    harness = DaemonHarness(tmp_path / "d", extra_toml=f'log_dir = "{logs}"')
    try:
        result = harness.cli("daemon", "run")
    finally:
        harness.close()
    assert result.returncode == ExitCode.STATE, result.stderr
    assert f"the log directory {logs} {error}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_log_directory_gpuq_makes_is_its_users_and_closed_to_others(tmp_path: Path) -> None:
    old = os.umask(0)  # a careless login shell's
    try:
        with running_daemon(tmp_path, extra_toml=f'log_dir = "{tmp_path / "new" / "logs"}"'):
            assert (tmp_path / "new" / "logs").stat().st_mode & 0o022 == 0
    finally:
        os.umask(old)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    with running_daemon(tmp_path) as harness:
        yield harness
