"""hello: the handshake (version checked by the connection before dispatch)."""

from __future__ import annotations

import os
from typing import Any

from gpuq import __version__
from gpuq.daemon.state import DaemonState
from gpuq.protocol import PROTOCOL_VERSION, Hello


def handle(state: DaemonState, request: Hello) -> dict[str, Any]:
    """Answer with the daemon's versions and identity."""
    return {
        "version": PROTOCOL_VERSION,
        "daemon_version": __version__,
        "pid": os.getpid(),
        "node": state.config.daemon.node_name,
        "config": None if state.config.source is None else str(state.config.source),
    }
