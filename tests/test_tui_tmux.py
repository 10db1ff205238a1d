"""`gpuq top` in a real terminal: tmux runs the real command against a real daemon.

Keys go in with `send-keys` and the screen comes back with `capture-pane`;
every check polls the captured screen until the expected text appears.
The tmux server is private to the test (its own socket name, no config).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.daemon_harness import DaemonHarness, wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """One private tmux server with one session."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a tmux command on this server."""
        return subprocess.run(
            ["tmux", "-L", self.name, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def screen(self) -> str:
        """The visible text of the session's pane."""
        return self.run("capture-pane", "-p", "-t", self.name).stdout

    def keys(self, *keys: str) -> None:
        """Type keys (tmux key names such as Enter and Escape, or literal text)."""
        result = self.run("send-keys", "-t", self.name, *keys)
        assert result.returncode == 0, result.stderr

    def alive(self) -> bool:
        """Whether the session (the command in it) still runs."""
        return self.run("has-session", "-t", self.name).returncode == 0

    def wait_for_text(self, *texts: str, timeout: float = 30.0) -> str:
        """Poll the screen until every text is on it; returns that screen."""
        return str(
            wait_for(
                lambda: (screen := self.screen()) and all(t in screen for t in texts) and screen,
                timeout=timeout,
                interval=0.1,
                what=f"{texts} on the screen; last screen:\n{self.screen()}",
            )
        )


@pytest.fixture
def tmux(daemon: DaemonHarness) -> Iterator[Tmux]:
    """A private tmux server, killed afterwards."""
    server = Tmux(f"gpuq-test-{os.getpid()}")
    yield server
    server.run("kill-server")


def test_gpuq_top_in_a_real_terminal(daemon: DaemonHarness, tmux: Tmux) -> None:
    running = daemon.submit(["sleep", "300"], gpus=1, name="alpha-run")
    daemon.submit(["sleep", "300"], gpus=1, hold=True, name="beta-held")
    daemon.wait_state(running, "running")
    # COLUMNS/LINES from the test's environment would override the pane's real size.
    command = (
        f"env -u COLUMNS -u LINES GPUQ_CONFIG={daemon.config_path} TERM=xterm-256color "
        f"{sys.executable} -m gpuq.cli.entry top --interval 0.5"
    )
    # The pane gets its size before the command starts, so the app never sees 80x24 first.
    started = tmux.run("new-session", "-d", "-s", tmux.name, "-x", "140", "-y", "40", "cat")
    assert started.returncode == 0, started.stderr
    respawned = tmux.run("respawn-pane", "-k", "-t", tmux.name, command)
    assert respawned.returncode == 0, respawned.stderr

    screen = tmux.wait_for_text("alpha-run", "beta-held", "Fake A100", "1 running")
    assert "Cannot reach" not in screen

    tmux.keys("/")
    tmux.wait_for_text("Filter jobs")
    tmux.keys("-l", "state:held")
    tmux.keys("Enter")
    screen = wait_for(
        lambda: (s := tmux.screen()) and "alpha-run" not in s and "beta-held" in s and s,
        timeout=30,
        what="only the held job",
    )
    assert "filter 'state:held'" in screen

    tmux.keys("?")
    tmux.wait_for_text("gpuq top: keys", "Cancel")
    tmux.keys("Escape")
    wait_for(lambda: "gpuq top: keys" not in tmux.screen(), timeout=30, what="help closed")

    tmux.keys("q")
    wait_for(lambda: not tmux.alive(), timeout=30, what="gpuq top to exit")
    assert daemon.job(running)["state"] == "running"  # quitting the UI leaves jobs alone
