"""The other servers' health, as `gpuq daemon status` and `gpuq gpus` show it.

Each server of `[[cluster.servers]]` is a `RemoteNode`
(`gpuq.daemon.node.remote`) whose long poll doubles as its heartbeat: a
server that answers is up; one silent for `cluster.down_after` seconds is
down, with the last error as the reason, and "unknown" until either
happens. `summary` lists them in the config's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Health:
    """What the head knows of one server now."""

    host: str
    state: str = "unknown"
    """"up", "down", or "unknown" until the first answer or `down_after` passes."""
    since: float = 0.0
    """When `state` last changed (or when watching began)."""
    reason: str | None = None
    """Why it is down (the last error's message)."""
    node: str | None = None
    pid: int | None = None
    gpus: int | None = None
    last_answer: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the status document."""
        return {
            "host": self.host,
            "state": self.state,
            "since": self.since,
            "reason": self.reason,
            "node": self.node,
            "pid": self.pid,
            "gpus": self.gpus,
            "last_answer": self.last_answer,
        }


class HasHealth(Protocol):
    """A server watched for its health (a `RemoteNode`)."""

    health: Health


def summary(hosts: Iterable[str], watched: Mapping[str, HasHealth]) -> list[dict[str, Any]]:
    """Each configured server's health, in the config's order."""
    return [(watched[host].health if host in watched else Health(host)).to_dict() for host in hosts]
