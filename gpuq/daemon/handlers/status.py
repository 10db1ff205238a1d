"""status: the daemon's own state."""

from __future__ import annotations

from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.protocol import DaemonStatus


def handle(state: DaemonState, request: DaemonStatus) -> dict[str, Any]:
    """Pid, version, paths, backend and job counts."""
    return state.status()
