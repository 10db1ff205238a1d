"""Faults a real daemon must survive, each with the behaviour it must show.

Bad input on the socket gets a clear error and the daemon keeps serving;
the socket is private; a second daemon or a stale socket is handled; bad
submissions are refused with the right code; a dead shim, a cancel and a
full disk all end jobs with a recorded state and no process left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.config import load_config
from gpuq.daemon import jobfiles
from gpuq.daemon.connection import HELLO_SECONDS, MAX_CONNECTIONS_PER_USER, admit
from gpuq.daemon.identity import Account, Caller
from gpuq.daemon.server import DAEMON_LOG_MAX_BYTES, QuietAccept
from gpuq.errors import ExitCode, GpuqError
from gpuq.protocol import MAX_REQUEST_BYTES, PROTOCOL_VERSION
from tests.daemon_harness import DaemonHarness, mounted_tmpfs, running_daemon, wait_for

G = 1024**3
HELLO = b'{"id": 0, "method": "hello", "params": {"version": %d}}\n' % PROTOCOL_VERSION


def assert_serving(daemon: DaemonHarness) -> None:
    """The daemon process lives and answers a status request."""
    assert daemon.process is not None and daemon.process.poll() is None, daemon.log()
    assert daemon.call("status")["pid"] == daemon.process.pid


class Raw:
    """A bare connection to the daemon: lines in, decoded reply objects out."""

    def __init__(self, daemon: DaemonHarness, *, hello: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(daemon.runtime_dir / "gpuq.sock"))
        self.file = self.sock.makefile("rb")
        if hello:
            assert "result" in self.ask(HELLO)

    def ask(self, line: bytes) -> dict[str, Any]:
        """Send one line, return the reply it gets."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(line if line.endswith(b"\n") else line + b"\n")
        reply = json.loads(self.file.readline())
        assert isinstance(reply, dict)
        return reply

    def closed(self) -> bool:
        """True once the daemon has closed the connection."""
        try:
            return self.file.readline() == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@contextlib.contextmanager
def raw(daemon: DaemonHarness, *, hello: bool = True) -> Iterator[Raw]:
    conn = Raw(daemon, hello=hello)
    try:
        yield conn
    finally:
        conn.close()


def error_of(reply: dict[str, Any]) -> dict[str, Any]:
    assert set(reply) == {"id", "error"}, reply
    error = reply["error"]
    assert isinstance(error, dict)
    return error


# -- bad input on the socket --------------------------------------------------


MALFORMED = "malformed JSON"


@pytest.mark.parametrize(
    ("line", "code", "message"),
    [
        pytest.param(b'{"id": 1, "method": "status"', "protocol", MALFORMED, id="truncated"),
        pytest.param(b"\xff\xfe\x00", "protocol", MALFORMED, id="not-utf8"),
        pytest.param(b"[1, 2, 3]", "protocol", "a request must be a JSON object", id="array"),
        pytest.param(b'"status"', "protocol", "a request must be a JSON object", id="string"),
        pytest.param(b'{"id": 1}', "protocol", "a request needs a string 'method'", id="no-method"),
        pytest.param(
            b'{"id": 1, "method": "frobnicate"}', "protocol", "unknown message", id="unknown"
        ),
        pytest.param(
            b'{"id": 1, "method": "show", "params": {"id": "7"}}',
            "invalid",
            "invalid value for show.id: expected int, got str",
            id="wrong-type",
        ),
        pytest.param(
            b'{"id": 1, "method": "cancel", "params": {"ids": 7}}',
            "invalid",
            "invalid value for cancel.ids: expected tuple[int, ...], got int",
            id="not-a-list",
        ),
        pytest.param(
            b'{"id": 1, "method": "show", "params": {}}',
            "invalid",
            "missing parameter show.id",
            id="missing-param",
        ),
        pytest.param(
            b'{"id": 1, "method": "gpus", "params": {"x": 1}}',
            "invalid",
            "unknown parameter(s) for gpus: x",
            id="unknown-param",
        ),
        pytest.param(
            b'{"id": 1, "method": "list", "params": {"limit": -1}}',
            "invalid",
            "list.limit must be 0 or more, got -1",
            id="negative-limit",
        ),
        pytest.param(
            b'{"id": 1, "method": "logs", "params": {"id": 1, "tail": -3}}',
            "invalid",
            "logs.tail must be 0 or more, got -3",
            id="negative-tail",
        ),
        pytest.param(b'{"id": NaN, "method": "status"}', "protocol", MALFORMED, id="nan"),
        pytest.param(b'{"id": 1, "params": {"id": 1e999}}', "protocol", MALFORMED, id="inf"),
        pytest.param(
            b'{"id": 1, "method": "show", "params": {"id": 99999999999999999999}}',
            "invalid",
            "invalid value for show.id: out of range",
            id="int-over-64-bits",
        ),
        pytest.param(b'{"id": 1' + b"0" * 5000 + b"}", "protocol", MALFORMED, id="5000-digits"),
        pytest.param(b'{"token": "\\udc80"}', "protocol", MALFORMED, id="lone-surrogate"),
        pytest.param(
            b'{"id": 1, "method": "list", "method": "shutdown"}',
            "protocol",
            "malformed JSON: key 'method' given twice",
            id="a-key-twice",
        ),
        pytest.param(
            b'{"id": 1, "method": "show", "params": {"id": 1, "id": 2}}',
            "protocol",
            "malformed JSON: key 'id' given twice",
            id="a-param-twice",
        ),
        pytest.param(b"[" * 50_000 + b"]" * 50_000, "protocol", MALFORMED, id="deep-nesting"),
        # Big-endian: the line's last byte is its newline's, so it reaches the daemon whole.
        pytest.param(
            '{"id": 1, "method": "status"}\n'.encode("utf-16-be"),
            "protocol",
            MALFORMED,
            id="utf-16",
        ),
        pytest.param(
            '{"id": 1, "method": "status"}\n'.encode("utf-32-be"),
            "protocol",
            MALFORMED,
            id="utf-32",
        ),
    ],
)
def test_bad_input_gets_an_error_reply_and_the_connection_stays_usable(
    daemon: DaemonHarness, line: bytes, code: str, message: str
) -> None:
    with raw(daemon) as conn:
        error = error_of(conn.ask(line))
        assert error["code"] == code
        assert message in error["message"]
        assert "result" in conn.ask(b'{"id": 2, "method": "status"}')
    assert_serving(daemon)


@pytest.mark.parametrize("offset", [6, 1000, 2**62, 2**63 - 1])
def test_a_logs_offset_at_or_past_the_end_reads_nothing_and_keeps_its_place(
    daemon: DaemonHarness, offset: int
) -> None:
    job_id = daemon.submit(["echo", "hello"], gpus=0)
    daemon.wait_state(job_id, "succeeded")
    request = {"id": 1, "method": "logs", "params": {"id": job_id, "offset": offset}}
    with raw(daemon) as conn:
        reply = conn.ask(json.dumps(request).encode())  # no data event comes first
        assert set(reply) == {"id", "result"}, reply
        assert (reply["result"]["offset"], reply["result"]["state"]) == (offset, "succeeded")
    assert "Traceback" not in daemon.log()
    assert_serving(daemon)


def test_an_unknown_method_asks_whether_the_daemon_is_up_to_date(daemon: DaemonHarness) -> None:
    with raw(daemon) as conn:
        reply = conn.ask(b'{"id": 5, "method": "frobnicate", "params": {}}')
    assert reply["id"] == 5
    error = error_of(reply)
    assert error["message"] == "unknown message 'frobnicate': is the daemon up to date?"
    assert "submit" in error["hint"]


def test_an_error_reply_carries_the_request_id(daemon: DaemonHarness) -> None:
    with raw(daemon) as conn:
        assert conn.ask(b'{"id": "abc", "method": "show", "params": {"id": 123}}') == {
            "id": "abc",
            "error": {"code": "not_found", "message": "no job 123", "hint": "no job was submitted"},
        }


def test_a_line_of_exactly_the_limit_is_served(daemon: DaemonHarness) -> None:
    request = b'{"id": 1, "method": "status"}'
    with raw(daemon) as conn:
        reply = conn.ask(request.ljust(MAX_REQUEST_BYTES))
    assert reply["id"] == 1 and "result" in reply


def test_an_oversized_line_gets_request_too_large_and_the_connection_closes(
    daemon: DaemonHarness,
) -> None:
    request = b'{"id": 1, "method": "status"}'
    with raw(daemon) as conn:
        reply = conn.ask(request.ljust(MAX_REQUEST_BYTES + 1) + b'\n{"id": 2, "method": "gpus"}')
        assert reply["id"] is None
        assert error_of(reply)["message"] == "request too large"
        assert conn.closed()
    with raw(daemon) as fresh:
        assert "result" in fresh.ask(request)
    assert_serving(daemon)


def test_a_line_cut_off_by_the_client_going_away_is_dropped_unanswered(
    daemon: DaemonHarness,
) -> None:
    """Answering half a megabyte of half a request kept it alive until the next full collection.

    Clients that hung up mid-line, over and over, grew the daemon by their
    lines' size each round (a lab daemon is anyone's to connect to).
    """
    with raw(daemon) as conn:
        conn.sock.sendall(b'{"id": 1, "method": "list", "params": {"name": "' + b"a" * 500_000)
        conn.sock.shutdown(socket.SHUT_WR)  # gone, as far as the daemon can tell
        assert conn.file.read() == b"", "no reply to a line that never ended"
    assert "Traceback" not in daemon.log() and "ERROR" not in daemon.log()
    assert_serving(daemon)


def test_the_first_request_must_be_hello(daemon: DaemonHarness) -> None:
    with raw(daemon, hello=False) as conn:
        for _ in range(2):
            reply = conn.ask(b'{"id": 1, "method": "status"}')
            assert reply["id"] == 1
            error = error_of(reply)
            assert error["code"] == "protocol"
            assert error["message"] == "the first request must be hello"
        assert "result" in conn.ask(HELLO)
        assert "result" in conn.ask(b'{"id": 2, "method": "status"}')
    assert_serving(daemon)


def test_a_wrong_protocol_version_names_both_versions(daemon: DaemonHarness) -> None:
    with raw(daemon, hello=False) as conn:
        error = error_of(conn.ask(b'{"id": 0, "method": "hello", "params": {"version": 999}}'))
        assert error["code"] == "protocol"
        assert "protocol version 999 is not supported" in error["message"]
        assert f"daemon speaks {PROTOCOL_VERSION}" in error["message"]
        assert "gpuq daemon restart" in error["hint"]
        assert conn.ask(HELLO)["result"]["version"] == PROTOCOL_VERSION
    assert_serving(daemon)


@pytest.mark.parametrize("method", ["wait", "logs"])
def test_a_client_gone_mid_request_is_dropped_without_an_error_in_the_log(
    daemon: DaemonHarness, method: str
) -> None:
    job_id = daemon.submit(["sleep", "60"], gpus=0)
    daemon.wait_state(job_id, "running")
    params = {"ids": [job_id]} if method == "wait" else {"id": job_id, "follow": True}
    with raw(daemon) as conn:
        conn.sock.sendall(
            json.dumps({"id": 7, "method": method, "params": params}).encode() + b"\n"
        )
        beat = json.loads(conn.file.readline())  # the request is being served
        assert beat == {"id": 7, "event": {"type": "heartbeat"}}
    wait_for(lambda: "its client went away" in daemon.log(), what="the request dropped")
    assert "Traceback" not in daemon.log() and "ERROR" not in daemon.log()
    assert_serving(daemon)


def test_a_connection_that_sends_no_hello_is_closed_blank_lines_or_not(
    daemon: DaemonHarness,
) -> None:
    """A silent client only holds a descriptor: it gets `HELLO_SECONDS`, however it idles."""
    with raw(daemon, hello=False) as silent, raw(daemon, hello=False) as chatty:
        for _ in range(int(HELLO_SECONDS) + 5):  # a blank line does not restart the clock
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                chatty.sock.sendall(b"\n")
            if chatty.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                break
        assert silent.closed() and chatty.closed()
    wait_for(lambda: "sent no hello in 10 s" in daemon.log(), what="the closes logged")
    assert_serving(daemon)


def test_a_lab_user_past_the_connection_cap_is_refused_and_others_are_not(
    tmp_path: Path,
) -> None:
    config = tmp_path / "lab.toml"
    config.write_text('[lab]\nenabled = true\nservice_account = "gpuq-lab"\n')
    lab, connections = load_config(str(config)), Counter[int]()

    def caller(uid: int, name: str) -> Caller:
        return Caller(Account(uid, uid, (), name, "/"), admin=False)

    for _ in range(MAX_CONNECTIONS_PER_USER):
        admit(lab, connections, caller(1001, "ann"))
    with pytest.raises(GpuqError) as caught:
        admit(lab, connections, caller(1001, "ann"))
    assert caught.value.exit_code == ExitCode.UNAVAILABLE
    assert caught.value.message.startswith(f"uid 1001 has {MAX_CONNECTIONS_PER_USER} connections")
    assert admit(lab, connections, caller(1002, "bo")) == 1002  # a cap per user, not for the daemon
    assert admit(lab, connections, caller(0, "root")) == 0
    for _ in range(MAX_CONNECTIONS_PER_USER + 1):
        admit(lab, connections, caller(990, "gpuq-lab"))  # the lab's servers
    assert connections[1001] == MAX_CONNECTIONS_PER_USER


def test_running_out_of_descriptors_logs_a_line_a_minute_not_a_flood(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet = QuietAccept(every=60.0)
    loop = asyncio.new_event_loop()
    try:
        context = {
            "message": "socket.accept() out of system resource",
            "exception": OSError(24, "Too many open files"),
        }
        with caplog.at_level(logging.ERROR, logger="gpuq.daemon"):
            for _ in range(10_000):
                quiet(loop, context)
            quiet.last -= 61  # a minute on
            quiet(loop, context)
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuq.daemon"]
    assert lines == [
        "cannot accept connections: Too many open files (1 time(s) since the last report); "
        "raise the open-file limit, or see who holds connections (ss -xp)",
        "cannot accept connections: Too many open files (10000 time(s) since the last report); "
        "raise the open-file limit, or see who holds connections (ss -xp)",
    ]


def test_the_daemons_own_log_is_kept_under_its_limit_start_and_latest_part(
    daemon: DaemonHarness,
) -> None:
    log = daemon.state_dir / "daemon-test.log"  # the daemon's stderr, opened for appending
    started = log.read_text()
    with log.open("ab") as flood:  # months of jobs, or an error repeated
        for _ in range(DAEMON_LOG_MAX_BYTES // (1024 * 1024) + 8):
            flood.write((b"x" * 1023 + b"\n") * 1024)  # a MiB
        flood.write(b"the latest line\n")
    wait_for(lambda: log.stat().st_size <= DAEMON_LOG_MAX_BYTES, what="the log trimmed")
    kept = log.read_text(errors="replace")
    assert kept.startswith(started[:200])  # how the daemon started
    assert kept.endswith("the latest line\n")
    assert "bytes of output dropped here" in kept and "(the daemon's own limit)]" in kept
    assert_serving(daemon)


# -- the socket and the single instance ---------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_socket_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)
    try:
        harness.runtime_dir.chmod(0o755)
        harness.start()
        assert stat.S_ISSOCK((harness.runtime_dir / "gpuq.sock").stat().st_mode)
        assert mode(harness.runtime_dir / "gpuq.sock") == 0o600
        assert mode(harness.runtime_dir) == 0o700
    finally:
        harness.close()


def test_socket_mode_in_the_config_sets_the_socket_s_mode(tmp_path: Path) -> None:
    with running_daemon(tmp_path, extra_toml="socket_mode = 0o660") as harness:
        assert mode(harness.runtime_dir / "gpuq.sock") == 0o660
        assert mode(harness.runtime_dir) == 0o700
        assert_serving(harness)


def start_second_daemon(daemon: DaemonHarness) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuq.daemon", "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_second_daemon_on_the_same_runtime_dir_fails_fast(daemon: DaemonHarness) -> None:
    second = start_second_daemon(daemon)
    assert second.returncode == ExitCode.UNAVAILABLE
    assert "another gpuq daemon is running" in second.stderr
    assert "gpuq daemon status" in second.stderr
    assert daemon.process is not None and daemon.process.poll() is None


def test_the_first_daemon_keeps_serving_after_a_second_one_is_refused(
    daemon: DaemonHarness,
) -> None:
    assert start_second_daemon(daemon).returncode == ExitCode.UNAVAILABLE
    assert_serving(daemon)


def test_the_refused_daemon_names_the_running_one(daemon: DaemonHarness) -> None:
    assert daemon.process is not None
    assert str(daemon.process.pid) in start_second_daemon(daemon).stderr


def test_a_stale_socket_with_no_listener_is_replaced(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)
    path = harness.runtime_dir / "gpuq.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with probe, pytest.raises(ConnectionRefusedError):
        probe.connect(str(path))
    try:
        harness.start()
        assert_serving(harness)
    finally:
        harness.close()


def test_the_socket_left_by_a_killed_daemon_is_replaced(daemon: DaemonHarness) -> None:
    daemon.kill()
    assert (daemon.runtime_dir / "gpuq.sock").exists()
    daemon.start()
    assert_serving(daemon)


def test_daemon_status_exits_5_when_no_daemon_runs(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)
    try:
        result = harness.cli("daemon", "status")
        assert result.returncode == 5
        assert "no gpuq daemon is running" in result.stderr
        assert result.stdout == ""
    finally:
        harness.close()


def test_after_daemon_stop_the_next_command_starts_a_daemon(daemon: DaemonHarness) -> None:
    assert daemon.process is not None
    old_pid = daemon.process.pid
    try:
        assert daemon.cli("daemon", "stop").returncode == 0
        assert daemon.process.wait(timeout=30) == 0
        assert daemon.cli("daemon", "status").returncode == ExitCode.UNAVAILABLE
        listing = daemon.cli("ls")
        assert listing.returncode == 0, listing.stderr
        status = daemon.cli("daemon", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] not in (old_pid, None)
    finally:
        daemon.cli("daemon", "stop")


# -- submissions that must be refused -----------------------------------------


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        pytest.param(
            {"cwd": "/no/such/dir"},
            "invalid",
            "working directory '/no/such/dir' does not exist",
            id="missing-cwd",
        ),
        pytest.param(
            {"cwd": __file__},
            "invalid",
            f"working directory {__file__!r} is not a directory",
            id="cwd-a-file",
        ),
        pytest.param(
            {"cwd": "."},
            "invalid",
            "spec.cwd must be an absolute path, got '.'",
            id="relative-cwd",
        ),
        pytest.param(
            {"array_index": 5},
            "invalid",
            "spec.array_index is set by the daemon, for each task of an array",
            id="array-index-without-an-array",
        ),
        pytest.param(
            {"command": ["no-such-command-gpuq"]},
            "invalid",
            "command not found: 'no-such-command-gpuq'",
            id="missing-command",
        ),
        pytest.param(
            {"command": ["./script.sh"]},
            "invalid",
            "'./script.sh' is not executable",
            id="script-not-executable",
        ),
        pytest.param(
            {"gpus": 3}, "resources", "the job needs 3 GPUs; this server has 2", id="gpus-3-of-2"
        ),
        pytest.param(
            {"gpus": 1, "gpu_mem": 39 * G},
            "resources",
            "--gpu-mem 39G is more than any GPU here can give (38.0G after the 5% safety margin)",
            id="gpu-mem-over-a-gpu",
        ),
        pytest.param(
            {"after": ["99"]},
            "not_found",
            "unknown dependency: no job or array 99",
            id="unknown-dependency",
        ),
        pytest.param(
            {"gpus": 0, "gpu_mem": G},
            "invalid",
            "--gpu-mem needs --gpus 1 or more",
            id="gpu-mem-without-gpus",
        ),
        pytest.param({"retries": -1}, "invalid", "--retries must be 0 or more", id="retries-neg"),
        pytest.param(
            {"begin": 1e300}, "invalid", "--begin must be before the year 10000", id="begin-far"
        ),
        pytest.param(
            {"signal": [10, -5], "time_limit": 3},
            "invalid",
            "--signal: the time before the limit must be 0 or more and less than "
            "1e12 seconds (some 31,700 years), got -5",
            id="signal-after-the-limit",
        ),
        pytest.param(
            {"output": "logs\0/out.txt"},
            "invalid",
            "spec.output contains a NUL character",
            id="nul-in-output",
        ),
    ],
)
def test_an_impossible_submission_is_refused_with_its_code_and_no_job(
    daemon: DaemonHarness, fields: dict[str, Any], code: str, message: str
) -> None:
    script = daemon.root / "script.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    script.chmod(0o644)
    spec = {"command": ["true"], "cwd": str(daemon.root), "env": dict(os.environ), **fields}
    with pytest.raises(GpuqError) as caught:
        daemon.call("submit", spec=spec)
    assert caught.value.code == code
    assert caught.value.message == message
    assert daemon.call("status")["highest_job_id"] == 0
    assert_serving(daemon)


def test_an_array_of_multi_node_jobs_is_refused_and_a_plain_array_is_numbered(
    daemon: DaemonHarness,
) -> None:
    spec = {"command": ["true"], "cwd": str(daemon.root), "env": dict(os.environ), "hold": True}
    with pytest.raises(GpuqError) as caught:
        daemon.call("submit", spec={**spec, "gpus": 2, "node_count": 2}, array=[0, 1])
    assert (caught.value.code, caught.value.message) == (
        "invalid",
        "an array task cannot span servers",
    )
    assert daemon.call("status")["highest_job_id"] == 0
    ids = daemon.call("submit", spec={**spec, "gpus": 0}, array=[3, 7])["ids"]
    assert [daemon.job(job_id)["array_index"] for job_id in ids] == [3, 7]


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (["--gpus", "3"], ExitCode.UNAVAILABLE, "the job needs 3 GPUs; this server has 2"),
        (["--gpus", "0", "--gpu-mem", "1G"], ExitCode.USAGE, "--gpu-mem needs --gpus 1 or more"),
        (
            ["--nodes", "2", "--gpus", "3"],
            ExitCode.USAGE,
            "--gpus 3 cannot be split evenly over --nodes 2",
        ),
        (["--after", "42"], ExitCode.NOT_FOUND, "unknown dependency: no job or array 42"),
    ],
)
def test_the_cli_reports_a_refused_submission_with_its_exit_code(
    daemon: DaemonHarness, args: list[str], exit_code: ExitCode, message: str
) -> None:
    result = daemon.cli("submit", *args, "--", "true")
    assert result.returncode == exit_code
    assert f"gpuq: error: {message}" in result.stderr
    assert result.stdout == ""
    assert_serving(daemon)


def test_a_job_can_depend_only_on_jobs_that_already_exist(daemon: DaemonHarness) -> None:
    first = daemon.submit(["true"], gpus=0, hold=True)
    with pytest.raises(GpuqError) as caught:
        daemon.submit(["true"], gpus=0, after=[str(first + 1)])
    assert caught.value.code == "not_found"
    assert caught.value.hint == "a job can only depend on jobs and arrays submitted before it"
    assert daemon.submit(["true"], gpus=0, after=[str(first)]) == first + 1
    assert_serving(daemon)


def test_a_dependent_of_a_failed_job_is_cancelled_naming_it(daemon: DaemonHarness) -> None:
    failing = daemon.submit(["sh", "-c", "exit 1"], gpus=0)
    dependent = daemon.submit(["true"], gpus=0, after=[str(failing)])
    daemon.wait_state(failing, "failed")
    job = daemon.wait_state(dependent, "cancelled")
    assert f"job {failing} failed" in job["reason"]
    assert job["attempts"] == 0 and job["start_time"] is None
    assert_serving(daemon)


# -- processes: a dead shim, cancel, a full disk --------------------------------


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def is_running(record: dict[str, Any]) -> bool:
    """True if the recorded process lives (a zombie counts as gone)."""
    fields = proc_stat(int(record["pid"]))
    return fields is not None and fields[0] != "Z" and int(fields[19]) == record["starttime"]


def group_members(pgid: int) -> dict[int, str]:
    """Live (non-zombie) processes of a process group, with their names."""
    members = {}
    for pid in group_states(pgid):
        with contextlib.suppress(OSError):
            members[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
    return members


def group_states(pgid: int) -> dict[int, str]:
    """Live (non-zombie) processes of a process group, with their state letters."""
    states = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = proc_stat(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
                states[int(entry.name)] = fields[0]
    return states


def job_record(daemon: DaemonHarness, job_id: int, name: str) -> dict[str, Any]:
    """The shim's or the child's record of a running job, once written."""
    path = daemon.state_dir / "jobs" / str(job_id) / name
    return dict(wait_for(lambda: jobfiles.read_json(path), what=f"{path}"))


def test_a_killed_shim_makes_the_job_lost_and_its_command_is_killed(
    daemon: DaemonHarness,
) -> None:
    job_id = daemon.submit(["sleep", "60"])
    daemon.wait_state(job_id, "running")
    shim = job_record(daemon, job_id, jobfiles.SHIM)
    child = job_record(daemon, job_id, jobfiles.CHILD)
    assert is_running(child)
    os.kill(int(shim["pid"]), signal.SIGKILL)
    job = daemon.wait_state(job_id, "lost")
    assert "shim" in job["reason"]
    wait_for(lambda: not group_members(int(child["pgid"])), what="the orphaned job to die")
    assert not is_running(child)
    assert_serving(daemon)


def test_cancel_kills_the_whole_process_tree(daemon: DaemonHarness) -> None:
    job_id = daemon.submit(["sh", "-c", "sleep 60 & sleep 60 & wait"], gpus=0)
    pgid = int(job_record(daemon, job_id, jobfiles.CHILD)["pgid"])
    wait_for(lambda: len(group_members(pgid)) == 3, what="sh and its two sleeps")
    daemon.call("cancel", ids=[job_id])
    job = daemon.wait_state(job_id, "cancelled")
    assert job["signal"] == "SIGTERM"
    wait_for(lambda: not group_members(pgid), what="every process of the job to die")
    assert_serving(daemon)


def test_cancel_reaches_a_job_whose_command_record_is_unreadable(daemon: DaemonHarness) -> None:
    """A torn or tampered child record: the shim's process tree is the job, and gets the signal."""
    job_id = daemon.submit(["sh", "-c", "sleep 600 & sleep 600 & wait"], gpus=0)
    pgid = int(job_record(daemon, job_id, jobfiles.CHILD)["pgid"])
    wait_for(lambda: len(group_members(pgid)) == 3, what="sh and its two sleeps")
    (daemon.state_dir / "jobs" / str(job_id) / jobfiles.CHILD).write_text('{"pid": 1')
    daemon.call("cancel", ids=[job_id])
    job = daemon.wait_state(job_id, "cancelled", timeout=30)
    assert job["signal"] == "SIGTERM"
    wait_for(lambda: not group_members(pgid), what="every process of the job to die")
    assert_serving(daemon)


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(daemon: DaemonHarness) -> None:
    job_id = daemon.submit(["sh", "-c", 'trap "" TERM; sleep 60'], gpus=0)
    pgid = int(job_record(daemon, job_id, jobfiles.CHILD)["pgid"])
    wait_for(lambda: "sleep" in group_members(pgid).values(), what="the trap to be set")
    daemon.call("cancel", ids=[job_id])
    job = daemon.wait_state(job_id, "cancelled")
    assert job["signal"] == "SIGKILL"
    wait_for(lambda: not group_members(pgid), what="every process of the job to die")
    assert_serving(daemon)


def test_a_job_suspended_as_it_starts_is_really_stopped(daemon: DaemonHarness) -> None:
    job_id = daemon.submit(["sleep", "60"], gpus=0)
    wait_for(lambda: daemon.job(job_id)["state"] == "running", interval=0.001)
    daemon.call("suspend", ids=[job_id])
    daemon.wait_state(job_id, "suspended")
    pgid = int(job_record(daemon, job_id, jobfiles.CHILD)["pgid"])
    wait_for(lambda: set(group_states(pgid).values()) == {"T"}, what="the job to be stopped")
    daemon.call("resume", ids=[job_id])
    daemon.wait_state(job_id, "running")
    wait_for(lambda: "T" not in group_states(pgid).values(), what="the job to continue")
    assert_serving(daemon)


@contextlib.contextmanager
def daemon_with_kill_grace(root: Path, grace: str) -> Iterator[DaemonHarness]:
    harness = DaemonHarness(root)
    text = harness.config_path.read_text()
    assert 'kill_grace = "2s"' in text
    harness.config_path.write_text(text.replace('kill_grace = "2s"', f"kill_grace = {grace}"))
    try:
        harness.start()
        yield harness
    finally:
        harness.close()


def cancel_the_moment_it_runs(daemon: DaemonHarness) -> int:
    """Cancel a job as soon as it is running, before it settles in."""
    job_id = daemon.submit(["sleep", "60"], gpus=0)
    wait_for(lambda: daemon.job(job_id)["state"] == "running", interval=0.001)
    daemon.call("cancel", ids=[job_id])
    return job_id


def test_a_job_cancelled_as_it_starts_still_gets_sigterm_first(tmp_path: Path) -> None:
    with daemon_with_kill_grace(tmp_path, '"120s"') as daemon:
        job_id = cancel_the_moment_it_runs(daemon)
        assert daemon.wait_state(job_id, "cancelled", timeout=60)["signal"] == "SIGTERM"


def test_a_job_cancelled_as_it_starts_with_no_grace_still_ends(tmp_path: Path) -> None:
    with daemon_with_kill_grace(tmp_path, "0") as daemon:
        job_id = cancel_the_moment_it_runs(daemon)
        daemon.wait_state(job_id, "cancelled", timeout=60)
        child = job_record(daemon, job_id, jobfiles.CHILD)
        wait_for(lambda: not group_members(int(child["pgid"])), what="the job to die")


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, mounted for the test (root only)."""
    with mounted_tmpfs(tmp_path / "full", "size=64k") as mount_point:
        yield mount_point


def test_a_full_disk_for_logs_fails_the_job_and_the_daemon_serves_on(
    daemon: DaemonHarness, tiny_filesystem: Path
) -> None:
    output = tiny_filesystem / "out.txt"
    job_id = daemon.submit(["head", "-c", "1048576", "/dev/zero"], gpus=0, output=str(output))
    job = daemon.wait_state(job_id, "succeeded", "failed", "lost")
    assert job["state"] == "failed"
    assert job["exit_code"] == 1
    assert output.stat().st_size <= 64 * 1024
    assert daemon.call("logs", id=job_id)["path"] == str(output)
    after = daemon.submit(["true"], gpus=0)
    daemon.wait_state(after, "succeeded")
    assert_serving(daemon)
