"""`gpuq bridge`: the daemon's protocol through stdin and stdout, as `ssh HOST gpuq bridge` uses it.

A real daemon and a real bridge process, as a head daemon would run it over
ssh: the handshake and requests pass through unchanged, malformed bytes get
the daemon's own error reply, closing stdin ends the bridge, a stopped daemon
ends it, and a bridge with no daemon to reach starts one.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gpuq.wire import PROTOCOL_VERSION
from tests.daemon_harness import DaemonHarness, running_daemon, wait_for

TIMEOUT = 60.0


@contextlib.contextmanager
def start_bridge(harness: DaemonHarness) -> Iterator[subprocess.Popen[bytes]]:
    """`gpuq bridge` for `harness`'s daemon, with pipes; killed at the end if still running."""
    with subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.entry", "bridge"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=harness.env,
    ) as bridge:
        try:
            yield bridge
        finally:
            if bridge.poll() is None:
                bridge.kill()


def send(bridge: subprocess.Popen[bytes], message: dict[str, Any] | bytes) -> None:
    assert bridge.stdin is not None
    line = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
    bridge.stdin.write(line)
    bridge.stdin.flush()


def reply(stdout: IO[bytes] | None) -> dict[str, Any]:
    """The next line from the bridge, as JSON (heartbeat events skipped)."""
    assert stdout is not None
    while True:
        line = stdout.readline()
        assert line, "the bridge closed its stdout"
        message: dict[str, Any] = json.loads(line)
        if message.get("event") != "heartbeat":
            return message


def hello(bridge: subprocess.Popen[bytes]) -> dict[str, Any]:
    send(bridge, {"id": 0, "method": "hello", "params": {"version": PROTOCOL_VERSION}})
    return reply(bridge.stdout)


def test_requests_pass_through_and_closing_stdin_ends_the_bridge(daemon: DaemonHarness) -> None:
    with start_bridge(daemon) as bridge:
        answer = hello(bridge)
        assert answer["id"] == 0
        assert answer["result"]["pid"] == daemon.process.pid  # type: ignore[union-attr]

        send(bridge, {"id": 1, "method": "gpus", "params": {}})
        gpus = reply(bridge.stdout)
        assert gpus["id"] == 1 and len(gpus["result"]["gpus"]) == 2

        assert bridge.stdin is not None
        bridge.stdin.close()
        assert bridge.wait(TIMEOUT) == 0
        assert bridge.stderr is not None and bridge.stderr.read() == b""


def test_malformed_bytes_get_the_daemons_error_and_the_daemon_keeps_serving(
    daemon: DaemonHarness,
) -> None:
    with start_bridge(daemon) as bridge:
        hello(bridge)
        send(bridge, b"\xff\xfe not json\n")
        error = reply(bridge.stdout)
        assert error["error"]["code"] and error["error"]["message"]

    with start_bridge(daemon) as again:
        assert hello(again)["result"]["pid"] == daemon.process.pid  # type: ignore[union-attr]


def test_a_stopped_daemon_ends_the_bridge(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as harness, start_bridge(harness) as bridge:
        hello(bridge)
        subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", "daemon", "stop"],
            env=harness.env,
            check=True,
            capture_output=True,
            timeout=TIMEOUT,
        )
        assert bridge.wait(TIMEOUT) == 0


def test_a_bridge_with_no_daemon_starts_one(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)
    pid = None
    try:
        with start_bridge(harness) as bridge:
            pid = hello(bridge)["result"]["pid"]
            assert Path(f"/proc/{pid}").exists()
    finally:
        subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", "daemon", "stop"],
            env=harness.env,
            capture_output=True,
            timeout=TIMEOUT,
        )
        if pid is not None:
            wait_for(lambda: not Path(f"/proc/{pid}").exists(), what="the daemon to stop")


def test_a_daemon_it_cannot_reach_fails_it_as_any_command(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    (runtime / "gpuq.sock").write_text("not a socket")  # something squats the socket's path
    config = tmp_path / "config.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nruntime_dir = "{runtime}"\n')
    env = {**os.environ, "GPUQ_CONFIG": str(config)}

    def gpuq(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT,
        )

    bridged, listed = gpuq("bridge"), gpuq("ls")
    assert bridged.returncode == listed.returncode != 0
    assert bridged.stdout == b""
    assert bridged.stderr == listed.stderr and b"gpuq.sock" in bridged.stderr
