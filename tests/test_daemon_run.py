"""`gpuq daemon run` is the daemon in the foreground, as systemd runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuq.client import Client
from tests.daemon_harness import DaemonHarness, wait_for


def test_daemon_run_serves_in_the_foreground_until_stopped(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli.entry", "daemon", "run", "--log-level", "INFO"],
        env=harness.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def answers() -> bool:
            try:
                Client.connect(harness.config, autostart=False).close()
            except Exception:  # noqa: BLE001 - not up yet
                return False
            return True

        wait_for(answers, what="the foreground daemon")
        assert harness.cli("daemon", "stop").returncode == 0
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "listening on" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        harness.close()
