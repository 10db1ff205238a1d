"""The other servers' health, kept by heartbeats: each server's session, up or down, and why.

For each server of `[[cluster.servers]]` the daemon keeps one session
(`gpuq.cluster.remote.SshClient`, `ssh HOST gpuq bridge`) and asks its
daemon for its status every `cluster.heartbeat` seconds. A server that
answers is up; one that has not answered for `cluster.down_after` seconds is
down, with the last error as the reason (a session that fails is closed and
opened again at the next beat). `gpuq daemon status` shows each server's
state, since when, and why.

Everything that talks to a server runs in a thread of its own, one beat per
server at a time: a server that hangs until its timeouts (connect and
client: up to tens of seconds) delays neither the event loop, nor the GPU
sampling's threads, nor the other servers, nor the daemon's exit (daemon
threads). The servers follow the config:
one added or removed by a reload is watched or dropped at the next beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpuq.cluster.remote import SshClient
from gpuq.config import Config, ServerDecl
from gpuq.errors import GpuqError

log = logging.getLogger("gpuq.daemon")


@dataclass
class Health:
    """What the head knows of one server now."""

    host: str
    state: str = "unknown"
    """"up", "down", or "unknown" until the first beat answers or `down_after` passes."""
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


class ServerWatch:
    """The sessions to the configured servers and their health (module docstring)."""

    def __init__(self) -> None:
        self.health: dict[str, Health] = {}
        self._sessions: dict[str, SshClient] = {}
        self._beating: dict[str, threading.Thread] = {}
        self._closed = False

    def summary(self) -> list[dict[str, Any]]:
        """Each server's health, in the config's order of the last beat."""
        return [health.to_dict() for health in self.health.values()]

    async def run(self, config_of: Any, should_exit: asyncio.Event) -> None:
        """Beat every configured server each `cluster.heartbeat` seconds until `should_exit`."""
        while not should_exit.is_set():
            config: Config = config_of()
            self._follow(config)
            for server in config.cluster.servers:
                running = self._beating.get(server.host)
                if running is None or not running.is_alive():
                    beat = threading.Thread(
                        target=self._beat,
                        args=(server, config),
                        name=f"gpuq-server-{server.host}",
                        daemon=True,  # a beat stuck in ssh never holds the daemon's exit
                    )
                    self._beating[server.host] = beat
                    beat.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(should_exit.wait(), timeout=config.cluster.heartbeat)

    def _follow(self, config: Config) -> None:
        """Watch the servers of `config`, in its order; drop those it no longer has."""
        hosts = [server.host for server in config.cluster.servers]
        for host in [h for h in self.health if h not in hosts]:
            del self.health[host]
            session = self._sessions.pop(host, None)
            if session is not None:
                threading.Thread(target=session.close, daemon=True).start()
        now = time.time()
        self.health = {host: self.health.get(host) or Health(host, since=now) for host in hosts}

    def _beat(self, server: ServerDecl, config: Config) -> None:
        """One heartbeat of `server` (in the pool's thread): ask its daemon, record the answer."""
        health = self.health.get(server.host)
        if health is None:
            return  # dropped from the config meanwhile
        try:
            session = self._sessions.get(server.host)
            if session is None:
                session = SshClient.connect_to(server, config)
                if self._closed:  # the daemon stopped while this session opened
                    session.close()
                    return
                self._sessions[server.host] = session
            status = session.call("status")
        except GpuqError as exc:
            self._failed(server.host, health, exc.message, config.cluster.down_after)
            return
        except OSError as exc:  # the session's socket, beyond what the client maps
            self._failed(server.host, health, str(exc), config.cluster.down_after)
            return
        now = time.time()
        if health.state != "up":
            log.info("server %s is up (node %s)", server.host, status.get("node"))
            health.state, health.since, health.reason = "up", now, None
        health.node, health.pid = str(status.get("node", "")), int(status.get("pid", 0))
        health.gpus, health.last_answer = int(status.get("gpus", 0)), now

    def _failed(self, host: str, health: Health, reason: str, down_after: float) -> None:
        session = self._sessions.pop(host, None)
        if session is not None:
            session.close()
        health.reason = reason
        now = time.time()
        silent_since = health.last_answer if health.last_answer is not None else health.since
        if health.state != "down" and now - silent_since >= down_after:
            log.warning("server %s is down: %s", host, reason)
            health.state, health.since = "down", now

    def close(self) -> None:
        """End every session (daemon shutdown) without waiting for beats in flight."""
        self._closed = True
        for session in list(self._sessions.values()):
            with contextlib.suppress(Exception):
                session.close()
        self._sessions.clear()
