"""The other servers as nodes: one `RemoteNode` per `[[cluster.servers]]` entry.

`follow` makes the daemon's remote nodes match the config, at start (before
recovery, which hands their jobs to them) and again after every reload. A
server dropped from the config is closed; the jobs that ran there are lost
to this head, since it can no longer reach them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

from gpuq.config import Config
from gpuq.daemon import lifecycle, safety, suspend
from gpuq.daemon.executor import Outcome
from gpuq.daemon.node.remote import RemoteNode
from gpuq.daemon.state import DaemonState


def head_name(config: Config) -> str:
    """How this daemon names itself to the servers it runs jobs on."""
    return config.daemon.node_name or socket.gethostname()


def follow(state: DaemonState) -> None:
    """Open a node for each configured server, close those no longer configured."""
    servers = {server.host: server for server in state.config.cluster.servers}
    for host in [h for h in state.remotes if h not in servers]:
        node = state.remotes.pop(host)
        node.close()
        for job in [j for j in state.active.values() if j.node == host and j.state.is_active]:
            reason = f"its server {host} was removed from the config"
            lifecycle.finish(state, job.id, Outcome(None, None, reason, None))
    loop = asyncio.get_running_loop()
    for host, server in servers.items():
        current = state.remotes.get(host)
        if current is not None:
            current.server = server  # a changed declaration applies from the next session
            continue
        node = RemoteNode(server, head_name(state.config), lambda: state.config, loop)
        node.listener = suspend.ChannelListener(state)
        node.on_news = state.wake.set
        state.remotes[host] = node
        node.start()


async def run(state: DaemonState) -> None:
    """Follow the config every heartbeat until the daemon stops; then close every node.

    Each heartbeat also asks the jobs due for a safety checkpoint (`gpuq.daemon.safety`).
    """
    try:
        while not state.should_exit.is_set():
            follow(state)
            safety.tick(state, time.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    state.should_exit.wait(), timeout=state.config.cluster.heartbeat
                )
    finally:
        for node in state.remotes.values():
            node.close()
