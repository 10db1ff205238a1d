"""The client never hangs and never shows a traceback: every failure is a GpuqError.

A server that accepts and closes, one that resets the connection, one that
never answers, a stopped daemon, and something that is not a socket at the
socket's path each give a clear error with a hint and a documented exit
code. Long requests (`wait`, `logs -f`) outlive the timeout because the
daemon sends heartbeats while they run, and a request whose client is gone
is cancelled at its next heartbeat. The hello travels with the first
request, so a command costs one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq import client as client_module
from gpuq.client import Client
from gpuq.config import load_config
from gpuq.daemon import connection
from gpuq.errors import ConfigError, DaemonUnavailable, ExitCode, GpuqError
from tests.daemon_harness import DaemonHarness, running_daemon


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """A private, short runtime directory (socket paths are limited to ~107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gq-"))
    try:
        yield path
    finally:
        for entry in path.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                entry.rmdir()
            else:
                entry.unlink()
        path.rmdir()


def config_file(root: Path, runtime_dir: Path, extra: str = "") -> Path:
    path = root / "config.toml"
    path.write_text(
        f'[daemon]\nstate_dir = "{root / "state"}"\nruntime_dir = "{runtime_dir}"\n{extra}\n'
    )
    return path


@contextlib.contextmanager
def fake_server(path: Path, on_accept: Callable[[socket.socket], None]) -> Iterator[None]:
    """A listener at `path` that hands each connection to `on_accept`, then closes it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                on_accept(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below; close() alone does not
        listener.close()
        thread.join(timeout=5)


def close_at_once(conn: socket.socket) -> None:
    conn.close()


def reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def read_then_close(conn: socket.socket) -> None:
    conn.recv(4096)


def garbage(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(b"\xff\xfe not json\n")


@pytest.mark.parametrize(
    "behaviour", [close_at_once, reset, read_then_close, garbage], ids=lambda f: f.__name__
)
def test_a_broken_server_gives_a_gpuq_error_every_time(
    tmp_path: Path, runtime_dir: Path, behaviour: Callable[[socket.socket], None]
) -> None:
    config = load_config(str(config_file(tmp_path, runtime_dir)))
    with fake_server(runtime_dir / "gpuq.sock", behaviour):
        for _ in range(300):
            with pytest.raises(GpuqError) as caught, Client.connect(config, autostart=False) as c:
                c.call("list")  # the hello's answer is read with the first request's
            assert caught.value.hint


def test_the_cli_reports_a_server_that_closes_with_exit_5_and_no_traceback(
    tmp_path: Path, runtime_dir: Path
) -> None:
    harness = DaemonHarness(tmp_path)
    harness.runtime_dir = runtime_dir
    harness.config_path = config_file(tmp_path, runtime_dir)
    with fake_server(runtime_dir / "gpuq.sock", close_at_once):
        for _ in range(5):
            result = harness.cli("ls")
            assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
            assert "Traceback" not in result.stderr
            assert result.stderr.startswith("gpuq: error: ")
            assert "hint: " in result.stderr


def test_a_server_that_never_answers_times_out_with_a_hint(
    tmp_path: Path, runtime_dir: Path
) -> None:
    config = load_config(str(config_file(tmp_path, runtime_dir, '[client]\ntimeout = "2.5s"')))
    released = threading.Event()

    def hold(conn: socket.socket) -> None:
        released.wait(timeout=60)

    with fake_server(runtime_dir / "gpuq.sock", hold):
        with (
            pytest.raises(DaemonUnavailable) as caught,
            Client.connect(config, autostart=False) as c,
        ):
            c.call("list")
        released.set()
    assert "did not answer within 2.5s" in caught.value.message
    assert caught.value.hint is not None and "[client] timeout" in caught.value.hint


def test_a_stopped_daemon_makes_commands_fail_after_the_timeout(tmp_path: Path) -> None:
    with running_daemon(tmp_path, extra_toml='[client]\ntimeout = "3s"') as daemon:
        assert daemon.process is not None
        os.kill(daemon.process.pid, signal.SIGSTOP)
        try:
            result = daemon.cli("ls")
            assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
            assert "did not answer within 3s" in result.stderr
            assert f"kill -CONT {daemon.process.pid}" in result.stderr
            assert "Traceback" not in result.stderr
        finally:
            os.kill(daemon.process.pid, signal.SIGCONT)
        assert daemon.cli("ls").returncode == 0


def test_wait_and_logs_follow_outlive_the_timeout(tmp_path: Path) -> None:
    with running_daemon(tmp_path, extra_toml='[client]\ntimeout = "3s"') as daemon:
        job_id = daemon.submit(["sh", "-c", "sleep 7; echo done"], gpus=0)
        waited = daemon.cli("wait", str(job_id))
        assert waited.returncode == 0, waited.stderr
        other = daemon.submit(["sh", "-c", "sleep 7; echo followed"], gpus=0)
        followed = daemon.cli("logs", "-f", str(other))
        assert followed.returncode == 0, followed.stderr
        assert followed.stdout == "followed\n"


def test_a_directory_at_the_socket_path_gets_a_clear_error(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)
    try:
        (harness.runtime_dir / "gpuq.sock").mkdir()
        result = harness.cli("ls")
        assert result.returncode == ExitCode.STATE, result.stderr
        assert "gpuq.sock is a directory" in result.stderr
        assert "hint: move it away" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        (harness.runtime_dir / "gpuq.sock").rmdir()
        harness.close()


def test_the_daemon_refuses_a_directory_at_its_socket_path(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)
    try:
        (harness.runtime_dir / "gpuq.sock").mkdir()
        result = harness.cli("daemon", "run")
        assert result.returncode == ExitCode.STATE, result.stderr
        assert "gpuq.sock is a directory" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        (harness.runtime_dir / "gpuq.sock").rmdir()
        harness.close()


@pytest.mark.parametrize("value", ["1s", 2, 0, "-3s", "soon"])
def test_a_client_timeout_must_outlast_the_heartbeat(tmp_path: Path, value: object) -> None:
    text = f'"{value}"' if isinstance(value, str) else str(value)
    path = tmp_path / "config.toml"
    path.write_text(f"[client]\ntimeout = {text}\n")
    with pytest.raises(ConfigError, match="client.timeout"):
        load_config(str(path))


def answer_both_lines(conn: socket.socket) -> None:
    """A daemon that answers only once the hello and the first request have both arrived."""
    received = b""
    while received.count(b"\n") < 2:
        chunk = conn.recv(65536)
        if not chunk:
            return
        received += chunk
    conn.sendall(b'{"id": 0, "result": {"pid": 1}}\n{"id": 1, "result": {"jobs": []}}\n')


def test_the_hello_and_the_first_request_travel_together(tmp_path: Path, runtime_dir: Path) -> None:
    config = load_config(str(config_file(tmp_path, runtime_dir, '[client]\ntimeout = "2.5s"')))
    with (
        fake_server(runtime_dir / "gpuq.sock", answer_both_lines),
        Client.connect(config, autostart=False) as client,
    ):
        assert client.call("list") == {"jobs": []}  # one round trip, not two
        assert client.hello == {"pid": 1}


def run_with_beats(
    work_seconds: float, monkeypatch: pytest.MonkeyPatch, alive: bool = True
) -> tuple[str, int]:
    """Run a request lasting `work_seconds` under heartbeats every 10 ms; (outcome, beats)."""
    monkeypatch.setattr(connection, "HEARTBEAT_SECONDS", 0.01)
    beats = 0

    def beat() -> bool:
        nonlocal beats
        beats += 1
        return alive

    async def work() -> dict[str, str]:
        if work_seconds:
            await asyncio.sleep(work_seconds)
        return {"answer": "done"}

    async def serve() -> str:
        try:
            result = await connection._with_heartbeats(work(), beat)
        except ConnectionResetError:
            task = asyncio.current_task()
            assert task is not None and not task.cancelling()  # the task itself lives on
            return "client gone"
        return str(result["answer"])

    return asyncio.run(serve()), beats


def test_a_request_that_never_waits_is_answered_without_heartbeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert run_with_beats(0, monkeypatch) == ("done", 0)


def test_a_long_request_sends_heartbeats_until_it_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, beats = run_with_beats(0.2, monkeypatch)
    assert outcome == "done"
    assert beats >= 2


def test_a_request_whose_client_is_gone_ends_with_the_connection_at_the_next_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert run_with_beats(30, monkeypatch, alive=False) == ("client gone", 1)


def test_a_daemon_of_another_protocol_version_is_named_even_with_a_request_behind_the_hello(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_daemon(tmp_path) as daemon:
        monkeypatch.setattr(client_module, "PROTOCOL_VERSION", 999)
        with (
            pytest.raises(GpuqError, match="protocol version 999 is not supported") as caught,
            Client.connect(daemon.config, autostart=False) as client,
        ):
            client.call("list")
        assert caught.value.hint is not None and "gpuq daemon restart" in caught.value.hint


def test_gpuq_daemon_stop_still_stops_a_daemon_from_before_the_final_parameter(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """An upgraded client stops the daemon still running the old code: `final` is dropped."""
    from gpuq.cli.app import _stop
    from gpuq.errors import ProtocolError
    from gpuq.protocol import encode, error_reply

    asked: list[dict[str, Any]] = []

    def old_daemon(conn: socket.socket) -> None:
        with conn.makefile("rb") as lines:
            for line in lines:
                message: dict[str, Any] = json.loads(line)
                asked.append(message)
                if message["params"].get("final"):  # what the old parser said of it
                    unknown = ProtocolError(
                        "unknown parameter(s) for shutdown: final", "known: none"
                    )
                    conn.sendall(encode(error_reply(message["id"], unknown)))
                    continue
                result: dict[str, Any] = {"stopping": True, "jobs_left_running": 0}
                if message["method"] == "hello":
                    result = {"pid": os.getpid(), "version": "0", "node": "here"}
                conn.sendall(encode({"id": message["id"], "result": result}))
                if message["method"] == "shutdown":
                    (runtime_dir / "gpuq.sock").unlink()  # as a daemon does on its way out
                    return

    config = load_config(str(config_file(tmp_path, runtime_dir)))
    with fake_server(runtime_dir / "gpuq.sock", old_daemon):
        _stop(config)
    shutdowns = [m["params"] for m in asked if m["method"] == "shutdown"]
    assert shutdowns == [{"final": True}, {}]
