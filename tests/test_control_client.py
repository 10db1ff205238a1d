"""The runner's end of the control channel, against a scripted daemon socket.

`gpuq.runner.init()` starts the channel thread only inside gpuq and only
with a control socket; the thread says hello, sends metrics, applies what
the daemon asks and reconnects when the daemon goes away. No torch here:
the job handle, the metrics recorder and the thread are all torch-free.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

import gpuq.runner as gq
from gpuq.runner.job import StepInfo, SuspendReport
from tests.daemon_harness import wait_for

if TYPE_CHECKING:
    from gpuq.runner.state import State


class ScriptedDaemon:
    """A listening control socket whose connections the test drives by hand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listening.bind(str(path))
        self.listening.listen(4)
        self.accepted: queue.Queue[socket.socket] = queue.Queue()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        self.conn: socket.socket | None = None
        self.buffer = b""

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listening.accept()
            except OSError:
                return
            self.accepted.put(conn)

    def welcome(self, interval: float = 5.0) -> dict[str, Any]:
        """Take the next connection, read its hello and welcome it; returns the hello."""
        if self.conn is not None:
            self.conn.close()
        self.conn, self.buffer = self.accepted.get(timeout=10), b""
        self.conn.settimeout(10)
        hello = self.receive()
        self.send({"type": "welcome", "version": 1, "metrics_interval": interval})
        return hello

    def send(self, message: dict[str, Any] | bytes) -> None:
        """Send a message (or raw bytes) on the current connection."""
        assert self.conn is not None
        raw = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.conn.sendall(raw)

    def receive(self) -> dict[str, Any]:
        """The next message on the current connection."""
        assert self.conn is not None
        while b"\n" not in self.buffer:
            chunk = self.conn.recv(65536)
            assert chunk, "the runner hung up"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def hang_up(self) -> None:
        """Close the current connection, as a daemon that died would."""
        assert self.conn is not None
        self.conn.close()
        self.conn = None

    def close(self) -> None:
        """Stop listening and close everything, a connection being accepted included.

        shutdown() wakes the thread blocked in accept(); once it has ended no
        connection can be queued behind the drain below (one accepted at the
        moment of closing used to leak, found on a loaded machine).
        """
        with contextlib.suppress(OSError):
            self.listening.shutdown(socket.SHUT_RDWR)
        self.listening.close()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the accept thread did not stop"
        if self.conn is not None:
            self.conn.close()
        while not self.accepted.empty():
            self.accepted.get().close()


@pytest.fixture
def scripted_daemon() -> Iterator[ScriptedDaemon]:
    """A scripted daemon on a short socket path (Unix socket paths are limited)."""
    directory = Path(tempfile.mkdtemp(prefix="gq-"))
    daemon = ScriptedDaemon(directory / "7.sock")
    try:
        yield daemon
    finally:
        daemon.close()
        shutil.rmtree(directory, ignore_errors=True)


def environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A job environment as the daemon writes it, attempt 2."""
    return {
        "GPUQ_JOB_ID": "7",
        "GPUQ_ATTEMPT": "2",
        "GPUQ_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        **extra,
    }


@pytest.fixture
def inside(tmp_path: Path, scripted_daemon: ScriptedDaemon) -> Iterator[gq.Job]:
    """A job handle inside gpuq whose channel talks to the scripted daemon."""
    job = gq.init(environ(tmp_path, GPUQ_CONTROL_SOCKET=str(scripted_daemon.path)))
    try:
        yield job
    finally:
        job.close()


def channel_threads() -> list[threading.Thread]:
    """The control-channel threads alive in this process."""
    return [t for t in threading.enumerate() if t.name == "gpuq-control"]


def step(job: gq.Job, number: int) -> None:
    """What `gq.step()` tells the hooks, without torch."""
    job.record_step(StepInfo(number, 0, 0.01, None, None, None))


# -- when there is a channel -----------------------------------------------------


def test_outside_gpuq_there_is_no_thread_and_no_recorder() -> None:
    job = gq.init({})
    try:
        assert not job.inside_gpuq
        assert job.channel is None
        assert job.metrics is None
        assert channel_threads() == []
    finally:
        job.close()


def test_inside_gpuq_without_a_control_socket_only_metrics_are_recorded(tmp_path: Path) -> None:
    job = gq.init(environ(tmp_path))
    try:
        assert job.metrics is not None
        assert job.channel is None
        assert channel_threads() == []
    finally:
        job.close()


def test_the_thread_says_hello_and_close_stops_it(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    hello = scripted_daemon.welcome()
    assert hello == {
        "type": "hello",
        "version": 1,
        "job_id": 7,
        "attempt": 2,
        "pid": hello["pid"],
        "features": ["checkpoint", "park", "metrics", "resize"],
    }
    assert len(channel_threads()) == 1
    inside.close()
    assert channel_threads() == []


def test_the_first_sample_goes_out_as_soon_as_there_is_a_step(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    scripted_daemon.welcome(interval=60.0)
    step(inside, 1)
    step(inside, 2)
    message = scripted_daemon.receive()
    assert message["type"] == "metrics"
    assert message["sample"]["step"] == 2


def test_a_newly_fitted_model_goes_out_at_once_not_at_the_end_of_the_interval(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    scripted_daemon.welcome(interval=600.0)
    step(inside, 1)
    assert "perf_params" not in scripted_daemon.receive()["sample"]  # the first sample
    assert inside.metrics is not None
    model = (0.1, 0.01, 0.0, 0.0, 0.0, 0.0, 1.0)
    inside.metrics.update_goodput(perf_params=model)
    sample = scripted_daemon.receive()["sample"]  # long before 600 s
    assert sample["perf_params"] == list(model)


# -- requests from the daemon ------------------------------------------------------


def test_a_suspend_request_is_left_for_the_next_boundary(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    inside.state = cast("State", object())  # the boundary would save this
    scripted_daemon.welcome()
    scripted_daemon.send({"type": "suspend", "mode": "park"})
    wait_for(lambda: inside.suspend_requested == "park", what="the park request")
    scripted_daemon.send({"type": "resume"})  # before the boundary: withdrawn
    wait_for(lambda: inside.suspend_requested is None, what="the withdrawal")
    scripted_daemon.send({"type": "suspend", "mode": "checkpoint"})
    wait_for(lambda: inside.suspend_requested == "checkpoint", what="the checkpoint request")
    scripted_daemon.send({"type": "resume"})
    wait_for(lambda: inside.suspend_requested is None, what="the checkpoint withdrawal")


def test_a_resume_from_the_daemon_never_withdraws_the_script_s_own_request(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    inside.state = cast("State", object())
    scripted_daemon.welcome()
    scripted_daemon.send({"type": "suspend", "mode": "park"})
    wait_for(lambda: inside.suspend_requested == "park", what="the park request")
    inside.request_suspend("checkpoint")  # as SIGUSR1 or the script itself would
    scripted_daemon.send({"type": "resume"})
    wait_for(lambda: inside._resume_event.is_set(), what="the resume")
    assert inside.suspend_requested == "checkpoint"


def parked_at_step_4(inside: gq.Job, scripted_daemon: ScriptedDaemon) -> None:
    """Welcome the runner, then park it at step 4 (the boundary's report, nobody waiting)."""
    inside.state = cast("State", object())
    scripted_daemon.welcome()
    wait_for(lambda: inside.channel is not None and inside.channel.connections == 1)
    inside.step = 4
    inside.report_suspend(SuspendReport("park", 4, 10, 0.01))
    assert scripted_daemon.receive()["detail"]["step"] == 4


def test_a_park_asked_of_a_parked_job_is_acknowledged_at_once(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    parked_at_step_4(inside, scripted_daemon)
    scripted_daemon.send({"type": "suspend", "mode": "park"})  # as after a daemon restart
    ack = scripted_daemon.receive()
    assert (ack["request"], ack["detail"]["parked"], ack["detail"]["step"]) == ("suspend", True, 4)


def test_a_park_asked_just_after_a_resume_waits_for_the_next_boundary(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    """The resume woke the job, which computes again before it can park.

    Acknowledged at once as parked, the daemon would count the job waiting
    while it computes, and give its GPU to the next one.
    """
    parked_at_step_4(inside, scripted_daemon)
    scripted_daemon.send({"type": "resume"})
    scripted_daemon.send({"type": "suspend", "mode": "park"})
    wait_for(lambda: inside.suspend_requested == "park", what="the park kept for the boundary")
    assert inside.resume_pending


def test_a_suspend_without_a_state_to_save_is_refused_at_once(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    scripted_daemon.welcome()
    scripted_daemon.send({"type": "suspend", "mode": "checkpoint"})
    ack = scripted_daemon.receive()
    assert ack == {
        "type": "ack",
        "request": "suspend",
        "ok": False,
        "detail": {"mode": "checkpoint", "error": "the script has no gpuq.runner.State to save"},
    }
    assert inside.suspend_requested is None


def test_a_checkpoint_request_is_answered_at_the_next_boundary(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    scripted_daemon.welcome()
    scripted_daemon.send({"type": "checkpoint"})
    wait_for(lambda: inside._checkpoint_requested, what="the request to arrive")
    inside.honour_checkpoint_request()  # what gq.step() does; no State here
    ack = scripted_daemon.receive()
    assert (ack["request"], ack["ok"]) == ("checkpoint", False)


def test_a_message_it_cannot_parse_is_skipped(
    inside: gq.Job, scripted_daemon: ScriptedDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    inside.state = cast("State", object())
    scripted_daemon.welcome()
    scripted_daemon.send(b"this is not json\n")
    scripted_daemon.send({"type": "suspend", "mode": "hibernate"})
    scripted_daemon.send({"type": "suspend", "mode": "checkpoint"})
    wait_for(lambda: inside.suspend_requested == "checkpoint", what="the valid request")
    assert capsys.readouterr().err.count("gpuq.runner: skipped a control message") == 2


# -- a daemon that goes away -------------------------------------------------------


def test_the_runner_reconnects_and_warns_only_once(
    inside: gq.Job, scripted_daemon: ScriptedDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted_daemon.welcome()
    for _ in range(2):
        scripted_daemon.hang_up()
        assert scripted_daemon.welcome()["job_id"] == 7  # it came back by itself
    assert inside.channel is not None
    wait_for(lambda: inside.channel is not None and inside.channel.connections == 3)
    assert capsys.readouterr().err.count("reconnecting in the background") == 1


def test_acknowledging_without_a_daemon_never_raises(
    inside: gq.Job, scripted_daemon: ScriptedDaemon
) -> None:
    scripted_daemon.close()  # nobody listens any more
    inside.send_ack("suspend", mode="checkpoint", step=1, bytes=10, seconds=0.1)
    assert inside.channel is not None
    assert not inside.channel.connected
