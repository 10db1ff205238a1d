"""Start `gpuq top` for a configuration: check the terminal, reach the daemon, run."""

from __future__ import annotations

import math
import sys

from gpuq.client import Client
from gpuq.config import Config
from gpuq.errors import UsageError


def run_top(config: Config, *, interval: float = 1.0, compact: bool = False) -> None:
    """Run the TUI until the user quits; raises GpuqError when it cannot start.

    The daemon is started on demand here, as by every other command; once
    running, the app never starts one itself but shows a banner and waits.
    """
    if not 0 < interval < math.inf:  # NaN too
        raise UsageError(
            f"--interval must be a positive number of seconds, got {interval:g}",
            "e.g. --interval 2",
        )
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(
            "gpuq top needs a terminal",
            "in scripts use gpuq ls --json and gpuq gpus --json",
        )
    Client.connect(config).close()

    from gpuq.tui.app import GpuqTop
    from gpuq.tui.source import DaemonSource

    source = DaemonSource(config)
    try:
        GpuqTop(source, interval=interval, compact=compact).run()
    finally:
        source.close()
