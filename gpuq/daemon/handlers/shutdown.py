"""shutdown: stop the daemon; jobs keep running under their shims."""

from __future__ import annotations

from typing import Any

from gpuq.daemon.state import DaemonState
from gpuq.errors import DaemonUnavailable
from gpuq.protocol import Shutdown


def handle(state: DaemonState, request: Shutdown) -> dict[str, Any]:
    """Ask the main loop to exit after this reply."""
    state.stop_reason = "gpuq daemon stop" if request.final else "a shutdown request"
    if request.final:
        state.stopped_for_good = DaemonUnavailable(
            "the daemon was stopped (gpuq daemon stop); the jobs keep running",
            "start it again to follow them: gpuq daemon start",
        )
    state.should_exit.set()
    running = sum(1 for j in state.active.values() if j.state.is_active)
    return {"stopping": True, "jobs_left_running": running}
