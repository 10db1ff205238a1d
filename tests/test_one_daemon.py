"""One daemon for each state: commands that start one at once share it, and a second is refused.

Scripts often start several gpuq commands at once before any daemon runs;
each starts one, the losers find the lock taken and exit, and every command
reaches the winner. A shell whose runtime directory differs (cron sets no
XDG_RUNTIME_DIR) would start a second daemon on the same state, which would
run the queue's jobs twice: it is refused, naming the socket of the one that
runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq import statelock
from tests.daemon_harness import DaemonHarness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[DaemonHarness]:
    harness = DaemonHarness(tmp_path)
    try:
        yield harness
    finally:
        harness.cli("daemon", "stop")
        harness.close()


def gpuq(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_commands_started_at_once_without_a_daemon_all_reach_one(harness: DaemonHarness) -> None:
    commands = [gpuq("ls", env=harness.env) for _ in range(3)]
    commands.append(gpuq("submit", "--hold", "--gpus", "0", "--", "true", env=harness.env))
    ended = [(command, *command.communicate(timeout=60)) for command in commands]
    for command, _, errors in ended:
        assert command.returncode == 0, errors
    status = harness.cli("daemon", "status", "--json")
    assert status.returncode == 0, status.stderr
    held = statelock.holder(harness.state_dir)
    assert held is not None and str(held.pid) in status.stdout


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A runtime directory of another shell (short: a socket path has ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gq-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_daemon_for_another_runtime_directory_is_refused_the_same_state(
    harness: DaemonHarness, short_dir: Path
) -> None:
    harness.start()
    elsewhere = {**harness.env, "GPUQ_RUNTIME_DIR": str(short_dir)}
    assert harness.process is not None
    try:
        refused_then_free(harness, elsewhere, harness.process)
    finally:
        gpuq("daemon", "stop", env=elsewhere).communicate(timeout=60)


def refused_then_free(
    harness: DaemonHarness, elsewhere: dict[str, str], first: subprocess.Popen[bytes]
) -> None:
    pid = first.pid

    listed = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", "ls"],
        env=elsewhere,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 5
    assert f"is in use by another gpuq daemon (pid {pid}, socket" in listed.stderr
    assert "hint: that daemon has another runtime directory than this shell's" in listed.stderr
    assert f"reach it with GPUQ_RUNTIME_DIR={harness.runtime_dir} gpuq" in listed.stderr

    doctor = gpuq("doctor", env=elsewhere)
    out, _ = doctor.communicate(timeout=60)
    assert doctor.returncode == 1
    assert f"[FAIL] daemon: the state directory {harness.state_dir}" in out

    # The first daemon is untouched, and once it stops the state is free again.
    assert harness.cli("ls").returncode == 0
    assert harness.cli("daemon", "stop").returncode == 0
    first.wait(timeout=30)
    started = gpuq("ls", env=elsewhere)
    _, errors = started.communicate(timeout=60)
    assert started.returncode == 0, errors


def test_relative_directory_overrides_mean_the_same_to_the_daemon_it_starts(
    harness: DaemonHarness, short_dir: Path
) -> None:
    # The daemon runs in /, where "rel" and "st" would be other directories.
    env = {**harness.env, "GPUQ_RUNTIME_DIR": "rel", "GPUQ_STATE_DIR": "st"}
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", "daemon", "status", "--json"],
            env=env,
            cwd=short_dir,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        started = subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", "ls"],
            env=env,
            cwd=short_dir,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert started.returncode == 0, started.stderr
        status = subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", "daemon", "status", "--json"],
            env=env,
            cwd=short_dir,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        document = json.loads(status.stdout)
        assert document["state_dir"] == str(short_dir / "st")
        assert document["runtime_dir"] == str(short_dir / "rel")
        assert listed.returncode == 5  # none ran before
    finally:
        subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", "daemon", "stop"],
            env=env,
            cwd=short_dir,
            capture_output=True,
            timeout=60,
            check=False,
        )


def test_a_daemon_whose_socket_was_removed_is_named_not_waited_for(
    harness: DaemonHarness,
) -> None:
    harness.start()
    assert harness.process is not None
    (harness.runtime_dir / "gpuq.sock").unlink()
    result = harness.cli("ls")
    assert result.returncode == 5
    pid = harness.process.pid
    assert f"gpuq daemon {pid} holds {harness.runtime_dir} but does not answer" in result.stderr
    assert f"hint: was its socket removed? stop it (kill {pid})" in result.stderr
    assert harness.process.poll() is None  # left alone


def test_status_stop_and_doctor_say_a_daemon_runs_whose_socket_was_removed(
    harness: DaemonHarness,
) -> None:
    """Not "not running" (exit 0 for stop): the daemon goes on, and its pid is what to stop."""
    harness.start()
    assert harness.process is not None
    pid = harness.process.pid
    (harness.runtime_dir / "gpuq.sock").unlink()
    said = (
        f"gpuq: error: gpuq daemon {pid} holds the state directory {harness.state_dir}, but "
        f"its socket {harness.runtime_dir / 'gpuq.sock'} is gone (removed by a cleaner of "
        f"{harness.runtime_dir}?)\nhint: stop it (kill {pid}: its jobs keep running) and run "
        "the command again\n"
    )
    for command in (["daemon", "status"], ["daemon", "stop"]):
        result = harness.cli(*command)
        assert (result.returncode, result.stderr) == (5, said), command
    doctor = harness.cli("doctor")
    assert doctor.returncode == 1
    assert f"[FAIL] daemon: gpuq daemon {pid} holds the state directory" in doctor.stdout
    assert harness.process.poll() is None  # left alone


def test_a_runtime_directory_emptied_under_the_daemon_names_it_not_the_same_directory(
    harness: DaemonHarness,
) -> None:
    """A cleaner of /tmp took the socket and the lock: the hint is to stop the daemon."""
    harness.start()
    assert harness.process is not None
    for entry in harness.runtime_dir.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    result = harness.cli("ls")
    assert result.returncode == 5
    assert f"its socket {harness.runtime_dir / 'gpuq.sock'} is gone" in result.stderr
    assert f"hint: stop it (kill {harness.process.pid}: its jobs keep running)" in result.stderr
    assert "GPUQ_RUNTIME_DIR" not in result.stderr
