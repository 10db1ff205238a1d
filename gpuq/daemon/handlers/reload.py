"""reload: read the config file again (`gpuq daemon reload`, also on SIGHUP)."""

from __future__ import annotations

from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.protocol import Reload


def handle(state: DaemonState, request: Reload) -> dict[str, Any]:
    """Keys applied now, and keys that need a restart; an invalid file changes nothing."""
    return state.reload_config()
