"""The daemon's end of the per-job control channel, driven by a scripted runner.

Jobs here are plain shell scripts; the test itself plays the job's
gpuq.runner on the job's control socket (same user, raw Unix socket), so
every message and every transition can be checked one at a time: the
socket's life and permissions, the hello check, metrics storage and
streaming, park and checkpoint requests and their acknowledgements, and the
daemon surviving anything malformed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.control import MAX_CONTROL_BYTES
from gpuq.errors import ExitCode, NotFoundError
from tests.daemon_harness import DaemonHarness, running_daemon, wait_for

SLEEPER = ["sh", "-c", 'echo "$GPUQ_CONTROL_SOCKET" > where; exec sleep 60']


class ScriptedRunner:
    """A raw connection to a job's control socket, speaking for its runner."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.buffer = b""
        self.welcome: dict[str, Any] = {}

    def send(self, message: dict[str, Any]) -> None:
        """Send one message as a line of JSON."""
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def hello(self, job_id: int, features: tuple[str, ...] = ("checkpoint", "park")) -> None:
        """Say hello for `job_id` and check the welcome."""
        self.send(
            {
                "type": "hello",
                "version": 1,
                "job_id": job_id,
                "attempt": 1,
                "pid": os.getpid(),
                "features": list(features),
            }
        )
        welcome = self.receive()
        assert welcome is not None and welcome["type"] == "welcome", welcome
        self.welcome = welcome

    def receive(self) -> dict[str, Any] | None:
        """The next message from the daemon, or None once it closed the connection."""
        while b"\n" not in self.buffer:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def close(self) -> None:
        """Hang up."""
        self.sock.close()


def control_path(daemon: DaemonHarness, job_id: int) -> Path:
    """Where the daemon puts the job's control socket."""
    return daemon.runtime_dir / "ctl" / f"{job_id}.sock"


def start_sleeper(daemon: DaemonHarness, gpus: int = 0) -> int:
    """A job that records its GPUQ_CONTROL_SOCKET and sleeps; returns its id."""
    job_id = daemon.submit(SLEEPER, gpus=gpus)
    where = daemon.root / "where"
    wait_for(lambda: where.exists() and where.read_text().endswith("\n"), what="the job")
    return job_id


OPEN: list[ScriptedRunner] = []
"""Every scripted runner of the current test, closed after it."""


@pytest.fixture(autouse=True)
def _close_runners() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def scripted_runner(daemon: DaemonHarness, job_id: int) -> ScriptedRunner:
    """A raw connection to the job's control socket (closed after the test)."""
    runner = ScriptedRunner(control_path(daemon, job_id))
    OPEN.append(runner)
    return runner


def connected_runner(daemon: DaemonHarness, job_id: int) -> ScriptedRunner:
    """A scripted runner that has said hello for the job."""
    runner = scripted_runner(daemon, job_id)
    runner.hello(job_id)
    return runner


def reasons(daemon: DaemonHarness, job_id: int) -> list[str]:
    """The reasons of the job's event log, oldest first."""
    return [event["reason"] for event in daemon.call("show", id=job_id)["events"]]


def sample(step: int, time: float = 1000.0, **extra: Any) -> dict[str, Any]:
    """A metrics message."""
    return {"type": "metrics", "sample": {"time": time + step, "step": step, **extra}}


# -- the socket ----------------------------------------------------------------


def test_each_job_gets_a_private_control_socket_removed_when_it_ends(
    daemon: DaemonHarness,
) -> None:
    job_id = start_sleeper(daemon)
    path = control_path(daemon, job_id)
    assert (daemon.root / "where").read_text().strip() == str(path)
    info = path.stat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    daemon.call("cancel", ids=[job_id])
    daemon.wait_state(job_id, "cancelled")
    wait_for(lambda: not path.exists(), what="the socket to be removed")


def test_a_hello_for_another_job_is_refused(daemon: DaemonHarness) -> None:
    job_id = start_sleeper(daemon)
    stranger = scripted_runner(daemon, job_id)
    stranger.send({"type": "hello", "version": 1, "job_id": job_id + 1, "attempt": 1, "pid": 1})
    assert stranger.receive() is None
    connected_runner(daemon, job_id)  # the right job is still welcome


MALFORMED = {
    "not JSON": b"hello daemon\n",
    "not an object": b"[1, 2]\n",
    "unknown type": b'{"type": "teleport"}\n',
    "unknown field": b'{"type": "metrics", "sample": {"time": 1, "step": 1, "mood": 3}}\n',
    "negative step": b'{"type": "metrics", "sample": {"time": 1, "step": -1}}\n',
    "a daemon's message": b'{"type": "suspend", "mode": "checkpoint"}\n',
    "oversized": b'{"type": "metrics", "pad": "' + b"x" * MAX_CONTROL_BYTES + b'"}\n',
}


@pytest.mark.parametrize("line", MALFORMED.values(), ids=MALFORMED.keys())
@pytest.mark.parametrize("after_hello", [True, False], ids=["after hello", "first"])
def test_a_bad_message_closes_the_channel_and_the_daemon_carries_on(
    daemon: DaemonHarness, line: bytes, after_hello: bool
) -> None:
    job_id = start_sleeper(daemon)
    runner = scripted_runner(daemon, job_id)
    if after_hello:
        runner.hello(job_id)
    with contextlib.suppress(OSError):  # the daemon may hang up while it is being sent
        runner.sock.sendall(line)
    assert runner.receive() is None
    assert daemon.job(job_id)["state"] == "running"
    assert daemon.process is not None
    assert daemon.call("status")["pid"] == daemon.process.pid
    connected_runner(daemon, job_id)


# -- metrics ---------------------------------------------------------------------


def test_metrics_from_the_runner_are_stored_shown_and_listed(daemon: DaemonHarness) -> None:
    job_id = start_sleeper(daemon)
    runner = connected_runner(daemon, job_id)
    assert daemon.call("show", id=job_id)["metrics"] is None
    for step in (10, 20, 30):
        runner.send(sample(step, step_seconds=0.25, batch_size=64, loss=0.5))
    shown = wait_for(
        lambda: (m := daemon.call("show", id=job_id)["metrics"]) and m["step"] == 30 and m
    )
    assert shown == {
        "time": 1030.0,
        "step": 30,
        "epoch": 0,
        "step_seconds": 0.25,
        "batch_size": 64,
        "loss": 0.5,
        "gpus": 0,  # what the job held when the sample came: a CPU-only job
    }

    listed = daemon.call("metrics", id=job_id)
    assert listed["job"] == job_id
    assert [s["step"] for s in listed["samples"]] == [10, 20, 30]
    assert [s["step"] for s in daemon.call("metrics", id=job_id, since=1015)["samples"]] == [20, 30]
    assert [s["step"] for s in daemon.call("metrics", id=job_id, limit=2)["samples"]] == [20, 30]
    text = daemon.cli("show", str(job_id)).stdout
    assert "  Metrics:    step 30, epoch 0, 0.25s/step, batch 64, loss 0.5 (" in text


def test_runners_report_every_scheduler_interval_when_it_is_shorter_than_five_seconds(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path / "d", extra_toml="[scheduler]\ninterval = 1\n") as daemon:
        job_id = start_sleeper(daemon)
        assert connected_runner(daemon, job_id).welcome["metrics_interval"] == 1.0
        text = daemon.config_path.read_text().replace("interval = 1\n", "interval = 30\n")
        daemon.config_path.write_text(text)
        assert daemon.call("reload")["applied"] == ["scheduler.interval"]
        assert connected_runner(daemon, job_id).welcome["metrics_interval"] == 5.0


def test_gpuq_metrics_prints_the_samples_as_a_table_or_json(daemon: DaemonHarness) -> None:
    job_id = start_sleeper(daemon)
    runner = connected_runner(daemon, job_id)
    assert "no metrics" in daemon.cli("metrics", str(job_id)).stdout
    for step in (10, 20, 30):
        runner.send(sample(step, step_seconds=0.25, batch_size=64, memory_peak_bytes=2**30))
    wait_for(lambda: len(daemon.call("metrics", id=job_id)["samples"]) == 3)

    lines = daemon.cli("metrics", str(job_id)).stdout.splitlines()
    assert lines[0].split()[:4] == ["TIME", "STEP", "EPOCH", "S/STEP"]
    assert [line.split()[1] for line in lines[1:]] == ["10", "20", "30"]
    assert "1.0G" in lines[-1] and "0.25" in lines[-1]
    newest = json.loads(daemon.cli("metrics", str(job_id), "-n", "1", "--json").stdout)
    assert newest["job"] == job_id and [s["step"] for s in newest["samples"]] == [30]
    missing = daemon.cli("metrics", "77")
    assert missing.returncode != 0 and "no job 77" in missing.stderr


def test_metrics_of_an_unknown_job_are_not_found(daemon: DaemonHarness) -> None:
    with pytest.raises(NotFoundError, match="no job 77"):
        daemon.call("metrics", id=77)


def test_subscribers_of_the_metrics_topic_get_each_sample(daemon: DaemonHarness) -> None:
    job_id = start_sleeper(daemon)
    runner = connected_runner(daemon, job_id)
    got_one = threading.Event()

    def keep_sending() -> None:  # until the subscription, which starts concurrently, sees one
        step = 0
        while not got_one.wait(0.05):
            step += 1
            runner.send(sample(step))

    sender = threading.Thread(target=keep_sending)
    with daemon.client() as client:
        events = client.stream("subscribe", topics=["metrics"])
        sender.start()
        kind, event = next(events)
        got_one.set()
    sender.join()
    assert kind == "event"
    assert event["type"] == "metrics"
    assert event["job"] == job_id
    assert event["sample"]["step"] >= 1


# -- suspend modes -------------------------------------------------------------


def test_a_plain_job_cannot_be_parked_or_checkpointed_and_auto_stops_it(
    daemon: DaemonHarness,
) -> None:
    job_id = start_sleeper(daemon)
    for mode in ("checkpoint", "park"):
        result = daemon.cli("suspend", "--mode", mode, str(job_id))
        assert result.returncode == ExitCode.CONFLICT
        assert "its gpuq.runner is not connected" in result.stderr
    bogus = daemon.cli("suspend", "--mode", "hibernate", str(job_id))
    assert bogus.returncode == ExitCode.USAGE
    assert "unknown suspend mode 'hibernate'" in bogus.stderr

    assert daemon.cli("suspend", str(job_id)).stdout == f"job {job_id}: suspended\n"
    assert reasons(daemon, job_id)[-2:] == [
        "suspend requested (stop mode)",
        "suspended (stop mode)",
    ]


def test_park_asks_the_runner_and_its_ack_suspends_the_job(daemon: DaemonHarness) -> None:
    job_id = start_sleeper(daemon, gpus=1)
    runner = connected_runner(daemon, job_id)
    result = daemon.call("suspend", ids=[job_id], mode="park")["results"][0]
    assert result["state"] == "suspending"
    assert runner.receive() == {"type": "suspend", "mode": "park"}
    detail = {"mode": "park", "step": 3, "bytes": 2048, "seconds": 0.01}
    runner.send({"type": "ack", "request": "suspend", "ok": True, "detail": detail})

    job = daemon.wait_state(job_id, "suspended")
    assert len(job["gpu_uuids"]) == 1
    assert job["reason"] == (
        "suspended (park mode) at step 3: 2.0K in 0.01s moved to host memory; GPUs kept"
    )

    assert daemon.cli("resume", str(job_id)).stdout == f"job {job_id}: running\n"
    assert runner.receive() == {"type": "resume"}
    assert reasons(daemon, job_id)[-1] == "resumed by user (park mode)"


def test_auto_mode_checkpoints_a_job_whose_runner_is_connected(daemon: DaemonHarness) -> None:
    job_id = start_sleeper(daemon)
    runner = connected_runner(daemon, job_id)
    assert daemon.cli("suspend", str(job_id)).stdout == f"job {job_id}: suspending\n"
    assert runner.receive() == {"type": "suspend", "mode": "checkpoint"}
    assert reasons(daemon, job_id)[-1] == "suspend requested (checkpoint mode)"
    # Resuming before the job reached a boundary withdraws the request.
    assert daemon.cli("resume", str(job_id)).stdout == f"job {job_id}: running\n"
    assert runner.receive() == {"type": "resume"}
    assert reasons(daemon, job_id)[-1] == "resumed by user: the checkpoint request is withdrawn"


def test_a_refused_suspend_leaves_the_job_running_with_the_reason(daemon: DaemonHarness) -> None:
    job_id = start_sleeper(daemon)
    runner = connected_runner(daemon, job_id)
    daemon.call("suspend", ids=[job_id], mode="checkpoint")
    assert runner.receive() == {"type": "suspend", "mode": "checkpoint"}
    error = "the script has no gpuq.runner.State to save"
    runner.send({"type": "ack", "request": "suspend", "ok": False, "detail": {"error": error}})
    job = daemon.wait_state(job_id, "running")
    assert job["reason"] == f"the job refused to suspend: {error}"


def test_a_pending_request_is_sent_again_to_a_runner_that_reconnects(
    daemon: DaemonHarness,
) -> None:
    job_id = start_sleeper(daemon)
    first = connected_runner(daemon, job_id)
    daemon.call("suspend", ids=[job_id], mode="park")
    first.close()  # gone before it read the request (as when a daemon restarts)
    second = connected_runner(daemon, job_id)
    assert second.receive() == {"type": "suspend", "mode": "park"}
    assert daemon.job(job_id)["state"] == "suspending"
