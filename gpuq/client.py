"""Blocking client for the daemon socket, used by the CLI and scripts.

`Client.connect(config)` finds the daemon of that configuration, starting it
on demand, and performs the version handshake. `call` sends one request and
returns its result (raising the daemon's error as the matching GpuqError);
`stream` yields a streaming request's events and then its result.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuq.config import Config
from gpuq.errors import DaemonUnavailable, ProtocolError, from_wire
from gpuq.wire import MAX_REPLY_BYTES, PROTOCOL_VERSION, Envelope, decode, encode, parse_reply

SOCKET_NAME = "gpuq.sock"
START_TIMEOUT = 15.0


def socket_path(config: Config) -> Path:
    """The daemon socket of this configuration."""
    return config.daemon.runtime_dir / SOCKET_NAME


def daemon_log_path(config: Config) -> Path:
    """Where a daemon started on demand writes its log."""
    return config.daemon.state_dir / "daemon.log"


class Client:
    """One connection to the daemon, after a successful hello."""

    def __init__(self, sock: socket.socket, hello: dict[str, Any]) -> None:
        self._sock = sock
        self._file = sock.makefile("rb")
        self._next_id = 1
        self.hello = hello

    @classmethod
    def connect(cls, config: Config, *, autostart: bool = True) -> Client:
        """Connect to the daemon, starting it first if none is running."""
        path = socket_path(config)
        try:
            return cls._open(path)
        except (FileNotFoundError, ConnectionRefusedError):
            if not autostart:
                raise DaemonUnavailable(
                    f"no gpuq daemon is running ({path})", "start one: gpuq daemon start"
                ) from None
        start_daemon(config)
        return cls._open(path)

    @classmethod
    def _open(cls, path: Path) -> Client:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            sock.sendall(
                encode({"id": 0, "method": "hello", "params": {"version": PROTOCOL_VERSION}})
            )
            client = cls(sock, {})
            client.hello = client._read_result(0)
        except BaseException:
            sock.close()
            raise
        return client

    def close(self) -> None:
        """Close the connection."""
        self._file.close()
        self._sock.close()

    def interrupt(self) -> None:
        """Shut the connection down from another thread; a read blocked on it returns at once."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one request and return its result; events are discarded."""
        for item in self.stream(method, **params):
            if item[0] == "result":
                return item[1]
        raise ProtocolError("the daemon closed the stream without a result")  # pragma: no cover

    def stream(self, method: str, **params: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ("event", e) for each event, then ("result", r)."""
        request_id = self._next_id
        self._next_id += 1
        try:
            self._sock.sendall(encode({"id": request_id, "method": method, "params": params}))
        except OSError as exc:
            raise DaemonUnavailable(f"lost the connection to the daemon: {exc}") from exc
        while True:
            envelope = self._read(request_id)
            if envelope.event is not None:
                yield "event", envelope.event
            elif envelope.result is not None:
                yield "result", envelope.result
                return

    def _read_result(self, request_id: int) -> dict[str, Any]:
        envelope = self._read(request_id)
        if envelope.result is None:
            raise ProtocolError("expected a result from the daemon")
        return envelope.result

    def _read(self, request_id: int) -> Envelope:
        try:
            line = self._file.readline(MAX_REPLY_BYTES)
        except OSError as exc:
            raise DaemonUnavailable(f"lost the connection to the daemon: {exc}") from exc
        if not line:
            raise DaemonUnavailable(
                "the daemon closed the connection", "is it still running? gpuq daemon status"
            )
        envelope = parse_reply(decode(line))
        if envelope.error is not None:
            raise from_wire(envelope.error)
        if envelope.id != request_id:
            raise ProtocolError(f"reply for request {envelope.id!r}, expected {request_id}")
        return envelope


def start_daemon(config: Config) -> int:
    """Start a detached daemon for `config` and wait until it answers.

    Two clients racing to start one is harmless: the loser's daemon finds the
    instance lock taken and exits, and both clients reach the winner.
    """
    config.daemon.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = daemon_log_path(config)
    command = [sys.executable, "-m", "gpuq.daemon"]
    if config.source is not None:
        command += ["--config", str(config.source)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(  # noqa: S603
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd="/",
        )
    path = socket_path(config)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            Client._open(path).close()
            return proc.pid
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        code = proc.poll()
        if code is not None and code != 0:
            tail = _tail(log_path)
            raise DaemonUnavailable(
                f"the gpuq daemon failed to start (exit {code}): {tail}",
                f"see {log_path}; gpuq doctor checks the set-up",
            )
        time.sleep(0.02)
    raise DaemonUnavailable(
        f"the gpuq daemon did not answer within {START_TIMEOUT:.0f}s", f"see {log_path}"
    )


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) if text else "(empty log)"


def running_daemon_pid(config: Config) -> int | None:
    """The pid of the daemon answering on this configuration's socket, or None."""
    try:
        with Client._open(socket_path(config)) as client:
            return int(client.hello.get("pid", 0)) or None
    except (FileNotFoundError, ConnectionRefusedError, OSError):
        return None
