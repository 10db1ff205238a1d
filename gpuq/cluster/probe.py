"""Check one server over ssh: its daemon answers through `gpuq bridge`, and what it has.

`check` opens a session (`gpuq.cluster.remote.SshClient`), and asks for the
remote daemon's node name, pid, version and GPUs; when it cannot, the
session's error says why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpuq import __version__
from gpuq.cluster.remote import SshClient
from gpuq.config import Config, ServerDecl


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
    started = time.monotonic()
    with SshClient.connect_to(server, config) as client:
        hello = client.hello
        gpus = client.call("gpus").get("gpus", [])
    return ServerCheck(
        host=server.host,
        node=str(hello.get("node", "")),
        pid=int(hello.get("pid", 0)),
        daemon_version=str(hello.get("daemon_version", "")),
        gpus=tuple(str(gpu.get("name", "")) for gpu in gpus if isinstance(gpu, dict)),
        seconds=time.monotonic() - started,
    )
