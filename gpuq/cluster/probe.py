"""Check one server over ssh: its daemon answers through `gpuq bridge`, and what it has.

`check` opens a bridge session (`gpuq.cluster.ssh.bridge_argv`), sends the
handshake and a `gpus` request, closes its side and reads the answers: the
remote daemon's node name, pid, version and GPUs, or the reason it could not
(`gpuq.cluster.ssh.explain`). The whole check is bounded by the connect
timeout plus the client timeout; a session still silent then is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from gpuq import __version__
from gpuq.cluster.ssh import bridge_argv, explain
from gpuq.config import Config, ServerDecl
from gpuq.errors import DaemonUnavailable, GpuqError, ProtocolError
from gpuq.paths import ensure_private_dir
from gpuq.wire import PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class ServerCheck:
    """What a server's daemon said about itself."""

    host: str
    node: str
    pid: int
    daemon_version: str
    gpus: tuple[str, ...]
    """The names of its GPUs, in index order."""
    seconds: float
    """The whole check: ssh (or its shared connection), the bridge and two requests."""

    @property
    def version_note(self) -> str | None:
        """A warning when the server runs another gpuq release than this one (same protocol)."""
        if self.daemon_version == __version__:
            return None
        return f"{self.host} runs gpuq {self.daemon_version}, this is gpuq {__version__}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for --json."""
        return {
            "host": self.host,
            "node": self.node,
            "pid": self.pid,
            "daemon_version": self.daemon_version,
            "gpus": list(self.gpus),
            "seconds": round(self.seconds, 3),
        }


def check(server: ServerDecl, config: Config) -> ServerCheck:
    """Reach `server`'s daemon through ssh and `gpuq bridge` (module docstring)."""
    ensure_private_dir(config.daemon.runtime_dir)  # where the shared connection's socket goes
    argv = bridge_argv(server, config.cluster, config.daemon.runtime_dir)
    requests = [
        {"id": 0, "method": "hello", "params": {"version": PROTOCOL_VERSION}},
        {"id": 1, "method": "gpus", "params": {}},
    ]
    payload = b"".join(json.dumps(r).encode() + b"\n" for r in requests)
    limit = config.cluster.connect_timeout + config.client.timeout
    started = time.monotonic()
    with tempfile.TemporaryFile() as stderr:  # not a pipe: a shared connection may outlive us
        try:
            process = subprocess.Popen(  # noqa: S603 - argv built by bridge_argv
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise DaemonUnavailable(
                "ssh is not installed here", "install the OpenSSH client (Debian: openssh-client)"
            ) from None
        try:
            out, _ = process.communicate(payload, timeout=limit)
        except subprocess.TimeoutExpired:
            _kill(process)
            raise DaemonUnavailable(
                f"{server.host} did not answer within {limit:g}s",
                f"is it overloaded, or its daemon stopped? check by hand: "
                f"ssh {server.host} {server.command} daemon status",
            ) from None
        stderr.seek(0)
        errors = stderr.read().decode(errors="replace")
    replies = _replies(out)
    if 0 not in replies:
        raise explain(server.host, server.command, process.returncode, errors)
    hello = replies[0]
    if "error" in hello:
        raise _refused(server.host, hello["error"])
    gpus = replies.get(1, {}).get("result", {}).get("gpus", [])
    return ServerCheck(
        host=server.host,
        node=str(hello["result"].get("node", "")),
        pid=int(hello["result"].get("pid", 0)),
        daemon_version=str(hello["result"].get("daemon_version", "")),
        gpus=tuple(str(gpu.get("name", "")) for gpu in gpus if isinstance(gpu, dict)),
        seconds=time.monotonic() - started,
    )


def _replies(out: bytes) -> dict[int, dict[str, Any]]:
    """The reply lines by request id; anything that is not a reply is skipped."""
    replies: dict[int, dict[str, Any]] = {}
    for line in out.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and isinstance(message.get("id"), int):
            replies[message["id"]] = message
    return replies


def _refused(host: str, error: object) -> GpuqError:
    """The handshake's refusal, as the error to show (a version mismatch, usually)."""
    message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    if isinstance(error, dict) and error.get("code") == "protocol":
        return ProtocolError(
            f"{host} cannot talk with this gpuq ({__version__}, protocol "
            f"{PROTOCOL_VERSION}): {message}",
            "run the same gpuq release on every server (upgrade the older one)",
        )
    return DaemonUnavailable(f"the daemon on {host} refused the connection: {message}")


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
