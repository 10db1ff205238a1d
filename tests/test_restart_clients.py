"""A wait or a followed log outlives a daemon restart, as the jobs do.

`gpuq daemon restart` (an upgrade, a config change) closes every client's
connection. Jobs run on under their shims and are re-adopted, so what
waits on them goes on: `gpuq wait`, `submit --wait` and `cancel --wait`
reconnect and wait out the time they have left, and `gpuq logs --follow`
goes on from the byte it had reached, printing nothing twice and missing
nothing. A daemon that does not come back is reported once the reconnect
window ends.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.client import Client, ConnectionLost, reconnect, wait_jobs
from gpuq.errors import DaemonUnavailable
from gpuq.protocol import PROTOCOL_VERSION, encode
from tests.daemon_harness import DaemonHarness, running_daemon
from tests.daemon_harness import submit_cli as submit


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    with running_daemon(tmp_path) as harness:
        yield harness


def restart(daemon: DaemonHarness) -> None:
    daemon.stop()
    daemon.start()


def test_a_wait_goes_on_across_a_restart_and_returns_how_the_job_ended(
    daemon: DaemonHarness,
) -> None:
    job_id = submit(daemon, "--hold", "--gpus", "0", "--", "true")
    client = Client.connect(daemon.config, autostart=False)
    _ = client.hello  # connected before the restart, whatever the thread has sent by then
    lost: list[ConnectionLost] = []
    ended: list[list[dict[str, Any]]] = []
    waiter = threading.Thread(
        target=lambda: ended.append(
            wait_jobs(daemon.config, [job_id], client=client, on_lost=lost.append)
        )
    )
    waiter.start()
    restart(daemon)
    assert daemon.cli("release", str(job_id)).returncode == 0
    waiter.join(timeout=60)
    assert not waiter.is_alive()
    assert [job["state"] for job in ended[0]] == ["succeeded"]
    assert len(lost) == 1


def test_a_followed_log_goes_on_from_where_it_was_nothing_twice(daemon: DaemonHarness) -> None:
    script = "echo tick 1; while [ ! -e go ]; do sleep 0.05; done; echo tick 2"
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", script)
    daemon.wait_state(job_id, "running")
    follow = gpuq(daemon, "logs", "--follow", str(job_id))
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "tick 1\n"  # streaming: connected to this daemon
        restart(daemon)
        assert "stopping on SIGTERM: 1 job(s) keep running under their shims" in daemon.log()
        (daemon.root / "go").touch()
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert out == "tick 2\n"
    assert "the daemon closed the connection; waiting for it to come back" in err


def test_a_daemon_that_does_not_come_back_is_reported_when_the_window_ends(
    daemon: DaemonHarness,
) -> None:
    daemon.stop()
    lost = ConnectionLost("the daemon closed the connection", None)
    with pytest.raises(DaemonUnavailable, match="and no daemon answered within 1 s"):
        reconnect(daemon.config, lost, seconds=1.0)


def gpuq(daemon: DaemonHarness, *args: str) -> subprocess.Popen[str]:
    """A gpuq command running beside the test, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        env=daemon.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=daemon.root,
    )


def lines(conn: socket.socket) -> Iterator[dict[str, Any]]:
    """The reply objects the daemon sends on a bare connection, until it closes it."""
    with conn.makefile("rb") as replies:
        yield from (json.loads(line) for line in replies)


def test_a_daemon_stopped_for_good_answers_a_wait_in_flight_with_unavailable(
    daemon: DaemonHarness,
) -> None:
    job_id = submit(daemon, "--hold", "--gpus", "0", "--", "true")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        conn.connect(str(daemon.runtime_dir / "gpuq.sock"))
        hello = {"id": 0, "method": "hello", "params": {"version": PROTOCOL_VERSION}}
        wait = {"id": 1, "method": "wait", "params": {"ids": [job_id]}}
        conn.sendall(encode(hello) + encode(wait))
        replies = lines(conn)
        assert "result" in next(replies)
        assert next(replies) == {"id": 1, "event": {"type": "heartbeat"}}  # the wait is waiting
        stopped = daemon.cli("daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert daemon.process is not None and daemon.process.wait(timeout=15) == 0
        rest = [r for r in replies if r.get("event") != {"type": "heartbeat"}]
    assert [(r["id"], r["error"]["code"]) for r in rest] == [(1, "unavailable")]
    assert rest[0]["error"]["message"] == (
        "the daemon was stopped (gpuq daemon stop); the jobs keep running"
    )
    assert "stopping on gpuq daemon stop: 0 job(s) keep running under their shims" in daemon.log()
    daemon.start()
    assert daemon.call("show", id=job_id)["job"]["state"] == "held"  # nothing lost


def test_a_daemon_stopped_for_good_ends_a_followed_log_at_once_with_exit_5(
    daemon: DaemonHarness,
) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", "echo tick; sleep 60")
    follow = gpuq(daemon, "logs", "--follow", str(job_id))
    try:
        assert follow.stdout is not None and follow.stdout.readline() == "tick\n"
        stopped = daemon.cli("daemon", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert daemon.process is not None and daemon.process.wait(timeout=15) == 0
        _, err = follow.communicate(timeout=60)
        assert follow.returncode == 5, err
        assert "the daemon was stopped (gpuq daemon stop); the jobs keep running" in err
        assert "waiting for it to come back" not in err
    finally:
        follow.kill()
        daemon.start()
        daemon.cli("cancel", str(job_id))


def test_gpuq_daemon_restart_leaves_a_followed_log_to_reconnect(daemon: DaemonHarness) -> None:
    script = "echo tick 1; while [ ! -e go ]; do sleep 0.05; done; echo tick 2"
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", script)
    follow = gpuq(daemon, "logs", "--follow", str(job_id))
    try:
        assert follow.stdout is not None and follow.stdout.readline() == "tick 1\n"
        restarted = daemon.cli("daemon", "restart")
        assert restarted.returncode == 0, restarted.stderr
        (daemon.root / "go").touch()
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
        daemon.cli("daemon", "stop")
    assert follow.returncode == 0, err
    assert out == "tick 2\n"
    assert "waiting for it to come back" in err


def test_a_command_on_another_config_file_than_the_daemons_is_warned(
    daemon: DaemonHarness,
) -> None:
    """A daemon started by `gpuq ls --config test.toml` would quietly serve every later command."""
    other = daemon.root / "other.toml"
    other.write_text(daemon.config_path.read_text())  # the same socket, another file
    assert "warning" not in daemon.cli("ls").stderr  # the daemon's own file: nothing to say
    warning = (
        f"gpuq: warning: the daemon runs on {daemon.config_path}, not on {other} as this "
        "command does (gpuq daemon restart starts it on this command's)\n"
    )
    listed = daemon.cli("ls", "--config", str(other))
    assert listed.returncode == 0 and listed.stderr == warning
    refused = daemon.cli("submit", "--config", str(other), "--gpus", "99", "--", "true")
    assert refused.returncode == 5 and refused.stderr.startswith(warning)  # why, then the error
    assert "gpuq: error: the job needs 99 GPUs; this server has 2" in refused.stderr


@pytest.mark.parametrize("command", [["wait"], ["logs", "--follow"]])
def test_a_wait_or_a_followed_log_on_another_config_file_warns_before_it_blocks(
    daemon: DaemonHarness, command: list[str]
) -> None:
    """The warning comes while the command waits, not hours later when the job ends."""
    other = daemon.root / "other.toml"
    other.write_text(daemon.config_path.read_text())
    script = "while [ ! -e go ]; do sleep 0.05; done"
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", script)
    waiting = gpuq(daemon, *command, "--config", str(other), str(job_id))
    try:
        assert waiting.stderr is not None
        assert waiting.stderr.readline() == (
            f"gpuq: warning: the daemon runs on {daemon.config_path}, not on {other} as this "
            "command does (gpuq daemon restart starts it on this command's)\n"
        )
        assert waiting.poll() is None  # said while the job still runs
        (daemon.root / "go").touch()
        _, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 0 and err == ""  # said once


def test_doctor_warns_of_a_daemon_on_another_config_file(daemon: DaemonHarness) -> None:
    other = daemon.root / "other.toml"
    other.write_text(daemon.config_path.read_text())
    ours = daemon.cli("doctor", "--json")
    (check,) = [c for c in json.loads(ours.stdout)["checks"] if c["name"] == "daemon"]
    assert check["status"] == "ok", check
    theirs = daemon.cli("doctor", "--json", "--config", str(other))
    (check,) = [c for c in json.loads(theirs.stdout)["checks"] if c["name"] == "daemon"]
    assert check["status"] == "warn"
    assert check["message"].endswith(
        f"but the daemon runs on {daemon.config_path}, not on {other} as this command does"
    )
    assert check["hint"] == "gpuq daemon restart starts it on this command's"
